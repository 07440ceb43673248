"""The warehouse alert feed: one subscriber across every replica (``run_leader``)."""

from __future__ import annotations

import logging
import os
import socket

from django.db import transaction

from django_locks import Lock, leader_election
from django_locks.fencing import fenced_update
from testproject.clients import WarehouseClient
from testproject.inventory.models import FeedCursor, Product, StockAlert

logger = logging.getLogger("shop")


@leader_election("inventory:warehouse-feed")
def warehouse_feed(lock: Lock) -> None:
    """Read the warehouse's alerts while this process leads; return when ``lock.signal`` aborts."""
    cursor, _ = FeedCursor.objects.get_or_create(name="warehouse")
    leader = f"{socket.gethostname()}:{os.getpid()}"
    for alert in WarehouseClient().alerts(after=cursor.position, stop=lock.signal):
        with transaction.atomic():
            # Moving the cursor is fenced: a leader that paused and lost its lease moves nothing.
            moved = fenced_update(
                FeedCursor.objects.filter(name="warehouse", position__lt=alert.position),
                lock,
                position=alert.position,
            )
            if not moved:
                logger.warning("The feed moved on under a newer leader; stepping down")
                return
            StockAlert.objects.create(
                position=alert.position,
                product=Product.objects.filter(sku=alert.sku).first(),
                message=alert.message,
                leader=leader,
                fencing_token=lock.fencing_token,
            )
