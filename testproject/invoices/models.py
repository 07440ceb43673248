"""Orders and invoices; an invoice goes to accounting once, in the nightly export."""

from __future__ import annotations

from django.db import models

from django_locks.fencing import FencingTokenField

# `objects` is spelled out on every model: mypy runs with the package's test settings, where these
# apps are not installed.


class Order(models.Model):
    objects: models.Manager[Order] = models.Manager()
    customer = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    placed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Order {self.pk} ({self.customer})"


class Invoice(models.Model):
    objects: models.Manager[Invoice] = models.Manager()
    order = models.OneToOneField(Order, on_delete=models.PROTECT)
    number = models.CharField(max_length=20, unique=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    issued_at = models.DateTimeField(auto_now_add=True)
    exported_at = models.DateTimeField(null=True, blank=True)
    # The token of the export run that marked it exported: a paused run's late write is refused.
    export_token = FencingTokenField()

    def __str__(self) -> str:
        return self.number
