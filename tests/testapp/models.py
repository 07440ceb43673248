"""Models the tests write to, such as a fenced stock count."""

from __future__ import annotations

from django.db import models

from django_locks.fencing import FencingTokenField


class StockCount(models.Model):
    product = models.CharField(max_length=100, unique=True)
    count = models.IntegerField(default=0)
    fencing_token = FencingTokenField()
