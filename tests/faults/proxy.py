"""A small TCP proxy for the fault suite: forwards to a store, and can hang a route.

Each route is a listening port on 127.0.0.1 forwarding to one upstream (a worker gets a route of
its own, so one worker's connections can hang while the others go on). ``hang(route)`` stops
moving bytes in both directions on every connection of the route without closing anything: the
client sees no reset, no error, only silence (a blackholed network path). Bytes sent meanwhile
wait in the kernel's socket buffers and are delivered late when ``resume(route)`` is called, as a
congested or partitioned path would deliver them, so a request can reach the store long after its
client gave up. It runs an asyncio loop in a thread of the process that starts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from typing import Any

CHUNK = 65536


class Route:
    """One listening port and its connections; ``flowing`` is set while bytes may move."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.server: asyncio.base_events.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()


class Proxy:
    """``Proxy().start()``; ``add_route((host, port)) -> route id`` (its ``port(route)`` is where
    clients connect); ``hang(route)`` / ``resume(route)``; ``stop()`` closes everything."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faults-proxy")
        self._thread.daemon = True
        self._routes: list[Route] = []

    def start(self) -> Proxy:
        self._thread.start()
        return self

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=10)

    def add_route(self, upstream: tuple[str, int]) -> int:
        return int(self._call(self._add_route(upstream)))

    async def _add_route(self, upstream: tuple[str, int]) -> int:
        route = Route(upstream)

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(route, reader, writer)

        route.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        route.port = route.server.sockets[0].getsockname()[1]
        self._routes.append(route)
        return len(self._routes) - 1

    def port(self, route: int) -> int:
        return self._routes[route].port

    def routes(self) -> range:
        return range(len(self._routes))

    def hang(self, route: int) -> None:
        """Stop moving bytes on ``route`` (new connections are accepted, then hang too)."""
        self._loop.call_soon_threadsafe(self._routes[route].flowing.clear)

    def resume(self, route: int) -> None:
        """Deliver what waited, and go on forwarding."""
        self._loop.call_soon_threadsafe(self._routes[route].flowing.set)

    def reset(self, route: int) -> None:
        """Close every connection of ``route`` (a store restart looks like this to clients)."""
        self._loop.call_soon_threadsafe(self._close_all, self._routes[route])

    def _close_all(self, route: Route) -> None:
        for writer in list(route.writers):
            writer.close()

    async def _serve(
        self, route: Route, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*route.upstream)
        except OSError:
            client_w.close()
            return
        route.writers |= {client_w, server_w}
        try:
            await asyncio.gather(
                self._pipe(route, client_r, server_w), self._pipe(route, server_r, client_w)
            )
        finally:
            for writer in (client_w, server_w):
                route.writers.discard(writer)
                writer.close()

    async def _pipe(
        self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                # While hung, nothing is read: the peer's bytes stay in the kernel's buffers and
                # are neither answered nor refused.
                await route.flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                await route.flowing.wait()
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof():
                    writer.write_eof()

    def stop(self) -> None:
        async def shutdown() -> None:
            for route in self._routes:
                route.flowing.set()
                if route.server is not None:
                    route.server.close()
                self._close_all(route)

        with contextlib.suppress(Exception):
            self._call(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
