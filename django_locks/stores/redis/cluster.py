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
        # A node failed: discover first, whatever MOVED replies were remembered (a failover
        # moves slots without telling the slots nobody asked about).
        client = self._discovered(deadline) if self._refresh else None
        node = self._moved.get(slot)
        if node is not None:
            return node
        client = client or self._discovered(deadline)
        try:
            found = client.get_node_from_key(name)  # type: ignore[no-untyped-call]
        except redis.exceptions.SlotNotCoveredError as exc:
            self._refresh = True  # a map discovered mid-failover: discover it again next time
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
            stale = self._client if self._refresh else None
            if self._client is None or stale is not None:
                timeout = max(min(self._connect_timeout, deadline - time.monotonic()), 0.001)
                # Rediscovery starts from every node known, not only the URL's: the URL's node
                # may be the master that failed.
                known = [] if stale is None else stale.get_nodes()  # type: ignore[no-untyped-call]
                startup = [redis.cluster.ClusterNode(node.host, node.port) for node in known]  # type: ignore[no-untyped-call]
                with runtime.translate("Redis Cluster (discovering its topology)", ERRORS):
                    client = redis.cluster.RedisCluster.from_url(
                        self._url,
                        **self._extra,
                        **({"startup_nodes": startup} if startup else {}),
                        socket_timeout=timeout,
                        socket_connect_timeout=timeout,
                    )
                # Only a discovery that worked replaces the map (a failed one keeps the stale
                # map, and the next call tries again).
                self._client, self._refresh = client, False
                self._moved.clear()
                if stale is not None:
                    stale.close()
            return self._client
