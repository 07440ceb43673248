"""The invoices app."""

from django.apps import AppConfig


class InvoicesConfig(AppConfig):
    name = "testproject.invoices"
    label = "invoices"
