"""Models the tests write to, such as a fenced stock count."""

from __future__ import annotations

from django.db import models

from django_locks.fencing import FencingTokenField


class StockCount(models.Model):
    product = models.CharField(max_length=100, unique=True)
    count = models.IntegerField(default=0)
    fencing_token = FencingTokenField()


class LeaderWrite(models.Model):
    """One write attempt of a leader's work: who, with which token, when, and whether it counted.

    ``started`` and ``ended`` are ``time.monotonic()`` readings: on one machine every process
    shares that clock, so the writes of different processes are in one real-time order.
    """

    key = models.CharField(max_length=100)
    pid = models.IntegerField()
    fencing_token = models.BigIntegerField()
    started = models.FloatField()
    ended = models.FloatField()
    accepted = models.BooleanField()
