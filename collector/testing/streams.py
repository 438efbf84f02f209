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
"""

from __future__ import annotations

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
