"""Products and stock, the reconciliation runs, and the warehouse's alerts."""

from __future__ import annotations

from django.db import models

from django_locks.fencing import FencingTokenField

# `objects` is spelled out on every model: mypy runs with the package's test settings, where these
# apps are not installed.


class Product(models.Model):
    objects: models.Manager[Product] = models.Manager()
    sku = models.CharField(max_length=20, unique=True)
    name = models.CharField(max_length=100)
    in_stock = models.IntegerField(default=0)
    reconciled_at = models.DateTimeField(null=True, blank=True)
    # The token of the reconciliation run that wrote in_stock last.
    stock_token = FencingTokenField()

    def __str__(self) -> str:
        return self.name


class Reconciliation(models.Model):
    """One run of the stock reconciliation, as the worker saw it."""

    objects: models.Manager[Reconciliation] = models.Manager()
    started_at = models.DateTimeField(auto_now_add=True)
    fencing_token = models.BigIntegerField()
    worker = models.CharField(max_length=100)
    beat = models.CharField(max_length=100, blank=True)
    written = models.IntegerField(default=0)


class FeedCursor(models.Model):
    """How far the shop has read the warehouse's alert feed; written by the feed's leader only."""

    objects: models.Manager[FeedCursor] = models.Manager()
    name = models.CharField(max_length=50, primary_key=True)
    position = models.BigIntegerField(default=0)
    fencing_token = FencingTokenField()


class StockAlert(models.Model):
    objects: models.Manager[StockAlert] = models.Manager()
    position = models.BigIntegerField(unique=True)
    product = models.ForeignKey(Product, on_delete=models.CASCADE, null=True)
    message = models.CharField(max_length=200)
    leader = models.CharField(max_length=100)
    fencing_token = models.BigIntegerField()
    received_at = models.DateTimeField(auto_now_add=True)
