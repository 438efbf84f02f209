"""One Stream RPC driven by hand, for tests of the collector's protocol: send any
envelopes (malformed ones included) in any order, half-close, cancel, and see which
seqs were acked and how the stream ended.

    stream = RawStream(channel)
    stream.send(hello("c", 1, "run", 0, 1), comm_envelope("c", 2, "run", 0, 0, 10))
    stream.finish()                       # half-close; the collector acks, then ends it
    assert stream.acked == {1, 2} and stream.error is None

Acks are read on a thread of their own, so a test can wait for some seqs while the
stream stays open (``wait_acked``); a stream the collector aborts leaves its
``grpc.RpcError`` in ``error``.

``HeldStreams`` holds many streams open at once (idle, or after a first message),
for the collector's limits and scale tests.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterable

import grpc

from proto import pb, pb_grpc


class RawStream:
    """One bidi Stream driven by hand: send envelopes, collect acked seqs."""

    def __init__(self, channel: grpc.Channel, metadata=None, on_ack=None):
        self._on_ack = on_ack  # called with each Ack's seqs, before they count as acked
        self._outbox: queue.Queue = queue.Queue()
        self.acked: set[int] = set()
        self._cond = threading.Condition()
        self.error: grpc.RpcError | None = None
        self.done = threading.Event()
        stub = pb_grpc.CollectorStub(channel)
        self._call = stub.Stream(iter(self._outbox.get, None), metadata=metadata)
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self):
        try:
            for ack in self._call:
                if self._on_ack is not None:
                    self._on_ack(list(ack.seqs))
                with self._cond:
                    self.acked.update(ack.seqs)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.done.set()
            with self._cond:
                self._cond.notify_all()

    def send(self, *envelopes: pb.Envelope) -> None:
        for env in envelopes:
            self._outbox.put(env)

    def close(self) -> None:
        """Half-close: the server acks what is outstanding, then ends the stream."""
        self._outbox.put(None)

    def wait_acked(self, seqs: Iterable[int], timeout: float = 30.0) -> bool:
        want = set(seqs)
        with self._cond:
            return self._cond.wait_for(lambda: want <= self.acked or self.done.is_set(), timeout) and want <= self.acked

    def finish(self, timeout: float = 30.0) -> None:
        self.close()
        assert self.done.wait(timeout), "stream did not end"

    def cancel(self) -> None:
        self._call.cancel()
        self._outbox.put(None)


class HeldStreams:
    """``n`` Stream calls held open on one grpc.aio channel, from an event loop thread of
    their own: thousands of ranks' streams at the cost of one thread. Each stream sends
    ``first`` (a list of envelopes per stream, e.g. its Hello) or nothing at all, then stays
    silent; ``errors`` collects how the streams the collector ended were ended.

        with HeldStreams(endpoint, 1000, metadata=security.auth_metadata(token)) as held:
            ...                               # the collector now holds 1000 idle streams
    """

    def __init__(self, endpoint: str, n: int, *, metadata=None, first=None, timeout_s: float = 120.0):
        self.endpoint, self.n, self.metadata = endpoint, n, metadata
        self.errors: list[grpc.aio.AioRpcError] = []
        self.acked = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="held-streams", daemon=True)
        self._thread.start()
        self._run(self._open(first or [[] for _ in range(n)]), timeout_s)

    def _run(self, coro, timeout_s: float | None = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _open(self, first) -> None:
        self._channel = grpc.aio.insecure_channel(self.endpoint)
        stub = pb_grpc.CollectorStub(self._channel)
        self._calls = [stub.Stream(metadata=self.metadata) for _ in range(self.n)]
        self._readers = [asyncio.create_task(self._read(call)) for call in self._calls]
        for call, envelopes in zip(self._calls, first, strict=True):
            for env in envelopes:
                await call.write(env)

    async def _read(self, call) -> None:
        try:
            async for ack in call:
                self.acked += len(ack.seqs)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.errors.append(exc)
        except asyncio.CancelledError:
            pass

    def ended(self) -> int:
        """Streams the collector has ended so far."""
        return sum(task.done() for task in self._readers)

    def close(self) -> None:
        async def cancel():
            for call in self._calls:
                call.cancel()
            await asyncio.gather(*self._readers, return_exceptions=True)
            await self._channel.close()

        try:
            self._run(cancel(), 60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> HeldStreams:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
