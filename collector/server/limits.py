"""What one rank stream, and one peer, may hold of the collector.

The collector runs on grpc.aio: an open stream costs a coroutine and a few KiB, not
a thread, so thousands of ranks fit in one process. What still has to be bounded:

* a stream that sends nothing for ``idle_timeout_s`` is closed with UNAVAILABLE (the
  rank client reconnects and resends what is un-acked, as after any broken stream).
  A live rank is never that quiet: its watchdog sends a heartbeat every
  ``telemetry.heartbeat_s`` (at most 60 s);
* one peer (the client's IP address; every rank on a host shares it) may hold at most
  ``max_streams_per_peer`` streams; the next is refused with RESOURCE_EXHAUSTED naming
  the limit, which the client retries with backoff;
* each stream has a budget of rows and bytes per second (a token bucket holding one
  second's worth). A stream over budget is not refused: the collector stops reading it
  until the budget refills, so HTTP/2 flow control holds the flood in the sender, never
  in the collector's memory, and nothing already sent is lost or sent twice. Refusing
  instead would make the client resend everything un-acked, which only adds traffic.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar

from collector.data.config import ConfigBlock, setting


@dataclass(kw_only=True)
class StreamLimits(ConfigBlock):
    SECTION: ClassVar[str] = "streams"
    idle_timeout_s: float = setting(300.0, gt=0)  # longer than any heartbeat period (60 s at most)
    max_streams_per_peer: int = setting(8192, ge=1)  # a host of simulated or real ranks shares one address
    rows_per_s: float = setting(4_000_000.0, gt=0)  # per stream; a busy real rank sends ~10^4-10^5
    bytes_per_s: float = setting(float(256 << 20), gt=0)  # per stream, on the wire
    resends: bool = True  # take streams of earlier runs' spool files (collector.server.resends)


class StreamBudget:
    """One stream's token bucket of rows and bytes, refilled at the budget's rate up to
    one second's worth. A message may overdraw it (one message is never split); the
    next then waits until the bucket is back at zero."""

    __slots__ = ("bytes", "limits", "rows", "updated")

    def __init__(self, limits: StreamLimits, now: float):
        self.limits = limits
        self.rows, self.bytes, self.updated = limits.rows_per_s, limits.bytes_per_s, now

    def wait_s(self, now: float) -> float:
        """Seconds until the stream may send its next message (0: now)."""
        self._refill(now)
        return max(0.0, -self.rows / self.limits.rows_per_s, -self.bytes / self.limits.bytes_per_s)

    def spend(self, rows: int, nbytes: int, now: float) -> None:
        self._refill(now)
        self.rows -= rows
        self.bytes -= nbytes

    def _refill(self, now: float) -> None:
        elapsed, self.updated = max(0.0, now - self.updated), now
        lim = self.limits
        self.rows = min(lim.rows_per_s, self.rows + elapsed * lim.rows_per_s)
        self.bytes = min(lim.bytes_per_s, self.bytes + elapsed * lim.bytes_per_s)


class PeerStreams:
    """Open streams per peer address, against ``max_streams_per_peer``."""

    def __init__(self, limit: int):
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def open(self, peer: str) -> str | None:
        """Count a new stream of ``peer``; the refusal message if it is over the limit."""
        with self._lock:
            held = self._open.get(peer, 0)
            if held >= self.limit:
                return (
                    f"{peer} already holds {held} streams, the limit per peer "
                    f"(--max-streams-per-peer / streams.max_streams_per_peer = {self.limit}); retry later"
                )
            self._open[peer] = held + 1
            return None

    def close(self, peer: str) -> None:
        with self._lock:
            held = self._open.get(peer, 0) - 1
            if held > 0:
                self._open[peer] = held
            else:
                self._open.pop(peer, None)


def peer_host(peer: str) -> str:
    """'ipv4:10.0.0.7:51234' -> '10.0.0.7'; 'ipv6:[::1]:5' -> '::1'; anything else as is."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and rest:
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer
