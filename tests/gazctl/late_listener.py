"""A TCP forwarder that starts listening late: a broker endpoint unreachable at first."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

from gazette.testing.etcd import free_port


class LateListener:
    """Forwards connections on ``127.0.0.1:<port>`` to `target` (``host:port``), but
    listens only `delay` seconds after entering: connections before then are refused, as
    by a broker that is not up yet. Runs its own event loop in a thread."""

    def __init__(self, target: str, delay: float) -> None:
        self.target_host, _, port = target.rpartition(":")
        self.target_port = int(port)
        self.delay = delay
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.listening = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="late-listener", daemon=True)

    def __enter__(self) -> LateListener:
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self.delay)
        if self._stop.is_set():
            return
        server = await asyncio.start_server(self._forward, "127.0.0.1", self.port)
        self.listening.set()
        async with server:
            await self._stop.wait()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
