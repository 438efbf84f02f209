"""One gRPC Stream call from a rank to the collector: a queue feeding its requests
(envelopes, or a spool file whose still-unacked envelopes are read when their turn
comes), a thread ("rankscope-acks") reading the acks and the requests they carry.
collector.rank.client opens one per connection; it ends with the call.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

import grpc

from collector.data.codec import REJECTED_SEQ_KEY
from proto import pb_grpc

log = logging.getLogger("rankscope.client")

_CLOSE = object()  # on the outbox: the request iterator ends, and with it the call


class Stream:
    """One gRPC Stream call: a queue feeding its requests, a thread reading acks.

    It knows nothing of the client beyond four callbacks: ``on_ack(seqs)`` for each Ack,
    ``on_request(request)`` for each RankRequest an Ack carries, ``envelopes_of(path)`` for
    the still-unacked envelopes of a spool file queued on it, and ``on_dead()`` once the
    call has ended."""

    def __init__(
        self, stub: pb_grpc.CollectorStub, metadata, *, on_ack, envelopes_of, on_dead, on_request=None
    ) -> None:
        self._on_ack, self._envelopes_of, self._on_dead = on_ack, envelopes_of, on_dead
        self._on_request = on_request
        self.outbox: queue.Queue = queue.Queue()
        self.error: grpc.RpcError | Exception | None = None
        self.dead = threading.Event()
        self._feeder: threading.Thread | None = None  # gRPC's thread that pulls our requests
        self.call = stub.Stream(self._requests(), metadata=metadata)
        self.reader = threading.Thread(target=self._read_acks, name="rankscope-acks", daemon=True)
        self.reader.start()

    def _requests(self):
        self._feeder = threading.current_thread()
        while True:
            item = self.outbox.get()
            if item is _CLOSE:
                return
            if isinstance(item, Path):  # a spool file: stream the envelopes still un-acked
                yield from self._envelopes_of(item)
            else:
                yield item

    def _read_acks(self) -> None:
        try:
            for ack in self.call:
                if ack.seqs:
                    self._on_ack(ack.seqs)
                for request in ack.requests:
                    if self._on_request is not None:
                        try:
                            self._on_request(request)
                        except Exception:  # a request we cannot serve must not end the stream
                            log.exception("rankscope: could not serve the collector's %s request", request.kind)
        except Exception as e:  # grpc.RpcError, or anything the channel throws
            self.error = e
        self.dead.set()
        self._on_dead()

    def send(self, item) -> None:
        self.outbox.put(item)

    def close(self, join_s: float = 5.0) -> None:
        """Ends the call, waits (up to ``join_s`` in all) for the two threads in gRPC's code for it
        (the ack reader, and gRPC's own that pulls our requests) to leave, then lets the call go.
        A thread still in there at interpreter exit dies holding the call's lock (daemon threads
        stop where they wait for the GIL), and the call's ``__del__`` in the final garbage
        collection then waits for that lock forever: a rank that finished training never exits
        (a fresh clone's 4-rank run did, its rank 1 parked in that ``__del__``). Dropped here,
        the call's ``__del__`` runs now, while a thread that holds the lock can still let go."""
        deadline = time.monotonic() + join_s
        self.outbox.put(_CLOSE)
        try:
            self.call.cancel()
        except Exception:
            pass
        for thread in (self.reader, self._feeder):
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        if self.reader is not threading.current_thread():
            self.call = None


def rejected_seq(err) -> int | None:
    """The seq a refusal (INVALID_ARGUMENT) names in its trailing metadata, or None."""
    try:
        for key, value in err.trailing_metadata() or ():
            if key == REJECTED_SEQ_KEY:
                return int(value)
    except Exception:
        pass
    return None
