"""The inventory app."""

from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "testproject.inventory"
    label = "inventory"
