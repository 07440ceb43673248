"""Redis Cluster routing for the Redis store: the slot map, MOVED and ASK, topology refresh."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis.cluster
import redis.exceptions
from redis.crc import key_slot

from django_locks.exceptions import StoreError
from django_locks.stores import runtime

Node = tuple[str, int]
T = TypeVar("T")
MAX_REDIRECTS = 3
ERRORS = (redis.exceptions.RedisError, OSError)


class Topology:
    """The slot map of one process (``ProcessLocal``): redis-py's ``RedisCluster`` discovers it
    (the topology only: lock calls go through the store's own pools), MOVED replies patch it,
    and after a node failed it is discovered again (a failover moves slots to a replica without
    a MOVED for the slots never asked about)."""

    def __init__(self, url: str, extra: dict[str, Any], connect_timeout: float) -> None:
        self._url = url
        self._extra = extra
        self._connect_timeout = connect_timeout
        self._client: redis.cluster.RedisCluster | None = None
        self._moved: dict[int, Node] = {}
        self._refresh = False
        self._lock = threading.Lock()

    def node_for(self, name: bytes, deadline: float) -> Node:
        """The master serving ``name``'s slot, as far as this process knows."""
        slot = key_slot(name)
        node = self._moved.get(slot)
        if node is not None:
            return node
        client = self._discovered(deadline)
        try:
            found = client.get_node_from_key(name)  # type: ignore[no-untyped-call]
        except redis.exceptions.SlotNotCoveredError as exc:
            raise StoreError(f"No Redis Cluster node serves slot {slot}.") from exc
        return (found.host, found.port)

    def primaries(self, deadline: float) -> list[Node]:
        client = self._discovered(deadline)
        return [(node.host, node.port) for node in client.get_primaries()]  # type: ignore[no-untyped-call]

    def moved(self, slot: int, node: Node) -> None:
        """A MOVED reply: ``slot`` is served by ``node`` from now on."""
        self._moved[slot] = node

    def failed(self) -> None:
        """A node failed: discover the topology again before the next call."""
        self._refresh = True

    def routed(self, name: bytes, deadline: float, call: Callable[[Node, bool], T]) -> T:
        """``call(node, asking)`` on the master of ``name``'s slot, following MOVED (remembered)
        and ASK (a slot migrating: that one call goes to the importing node, after ``ASKING``)."""
        node, asking = self.node_for(name, deadline), False
        for _ in range(MAX_REDIRECTS):
            try:
                return call(node, asking)
            except redis.exceptions.AskError as exc:
                # MovedError is an AskError; a real ASK is not remembered.
                asking = not isinstance(exc, redis.exceptions.MovedError)
                if not asking:
                    self.moved(exc.slot_id, (exc.host, exc.port))
                node = (exc.host, exc.port)
        raise StoreError(f"Redis Cluster redirected {name!r} more than {MAX_REDIRECTS} times.")

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._moved.clear()
        if client is not None:
            client.close()

    def _discovered(self, deadline: float) -> redis.cluster.RedisCluster:
        with self._lock:
            if self._client is not None and self._refresh:
                self._refresh = False
                self._moved.clear()
                stale, self._client = self._client, None
                stale.close()
            if self._client is None:
                timeout = max(min(self._connect_timeout, deadline - time.monotonic()), 0.001)
                with runtime.translate("Redis Cluster (discovering its topology)", ERRORS):
                    self._client = redis.cluster.RedisCluster.from_url(
                        self._url,
                        **self._extra,
                        socket_timeout=timeout,
                        socket_connect_timeout=timeout,
                    )
            return self._client
