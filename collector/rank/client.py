"""Ships one rank's records to the collector, off the training thread.

One daemon thread ("rankscope-client") every ``flush_interval_s`` (or as soon
as ``batch_rows`` are waiting) takes what the RecordBuffer holds, encodes it
with collector.data.codec into Envelopes numbered 1, 2, 3... and writes them on one
bidirectional gRPC Stream. An envelope stays in ``unacked`` until the collector
acks it (it is durable then). When the stream breaks the thread reconnects with
exponential backoff and resends, on the new stream, the Hello and every
un-acked envelope with its original seq; the collector drops duplicates.

While the collector is unreachable, envelopes go to spool files (collector.rank.spool)
instead of piling up in memory; after a reconnect the files are streamed again
and deleted once all their envelopes are acked. When the spool cannot be written (a full
disk, a spool dir that is not private to this user) the envelopes stay in memory up to
``max_unacked_bytes``; beyond it the oldest are dropped (never the Hello), their rows
counted in ``dropped_unspooled``, in the RunEnd's dropped count and in one warning per outage.
The spool itself is bounded too: beyond ``max_spool_bytes`` of this process's files the oldest
file is deleted, its rows counted the same way. A partition (packets swallowed, nothing refused)
is noticed by HTTP/2 keepalive pings (``KEEPALIVE_S``), so its records go to the spool, not to
a queue in memory, and a healed link is used again within ``RECONNECT_MAX_S`` plus the backoff.
``close`` sends RunEnd, waits a bounded time for acks, and spools whatever is still un-acked.

Errors from the collector: INVALID_ARGUMENT names the rejected envelope in the
trailing metadata key ``rankscope-rejected-seq``: that envelope is dropped (its
rows are counted as dropped) and the rest resent. FAILED_PRECONDITION (schema
version) and UNAUTHENTICATED / PERMISSION_DENIED are logged once and retried
slowly while spooling, since only an operator can fix them.

Requests from the collector ride on the acks (``Ack.requests``, e.g. "send your
stacks"): the ack reader hands each to ``Client.on_request``, which the watchdog
(collector.rank.watchdog) sets; it must return at once (it queues the work).

Nothing here raises into the caller: ``submit`` and ``close`` are safe from any
thread, and a failing collector costs the training thread nothing.

Beside it: collector.rank.stream (one Stream call and its ack reader) and
collector.rank.resend (``resend_spooled``: spool files left by exited processes,
started here once the collector first answers; importable from here as before).
"""

from __future__ import annotations

import collections
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import grpc

from collector.data import codec, security
from collector.data.config import ConfigBlock, setting
from collector.rank import spool
from collector.rank.records import RecordBuffer
from collector.rank.resend import resend_spooled
from collector.rank.stream import Stream, rejected_seq
from proto import SCHEMA_VERSION, pb, pb_grpc

log = logging.getLogger("rankscope.client")

_OPERATOR_ERRORS = (
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
)
# How long the collector may be out of reach before the rank says so (once per outage), and how long
# ``close`` still tries a collector that has been out of reach: it spools at once rather than waiting
# close_timeout_s for acks that cannot come (the exit stays prompt).
UNREACHABLE_WARN_S = 3.0
SPOOL_RETRY_S = 5.0  # after a failed spool write (full disk, refused dir), the next try
UNREACHABLE_CLOSE_S = 1.0
# A partition does not refuse a connection, it swallows its packets: without pings a stream would
# stay "open" for the kernel's retransmission timeout (~15 min), its envelopes queued in memory
# and not spooled. HTTP/2 pings every KEEPALIVE_S, answered by the collector's transport however
# slow its disk, end such a stream within KEEPALIVE_S + KEEPALIVE_TIMEOUT_S; the collector allows
# pings this often (collector.server.service). gRPC's own reconnect backoff (up to 120 s by
# default) is held to RECONNECT_MAX_S, so a healed link is used again within seconds.
KEEPALIVE_S = 10.0
KEEPALIVE_TIMEOUT_S = 10.0
RECONNECT_MAX_S = 5.0
MAX_UNACKED_BYTES = 64 << 20  # telemetry.max_unacked_bytes
MAX_SPOOL_BYTES = 1 << 30  # telemetry.max_spool_bytes
CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", int(KEEPALIVE_S * 1000)),
    ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
    ("grpc.http2.max_pings_without_data", 0),  # a stalled stream sends no data: ping it anyway
    ("grpc.max_reconnect_backoff_ms", int(RECONNECT_MAX_S * 1000)),
)


@dataclass(kw_only=True)
class ClientConfig(ConfigBlock):
    """How a rank ships its records; the keys are ``telemetry.*``."""

    SECTION: ClassVar[str] = "telemetry"
    endpoint: str = "127.0.0.1:50051"
    token: str | None = None
    tls_ca: str | None = None  # PEM CA file: TLS to the collector, verified against it; None: plaintext
    spool_dir: str | os.PathLike | None = None  # None: collector.rank.spool.default_dir(); a Path once built
    batch_rows: int = setting(8192, ge=1)
    flush_interval_s: float = setting(0.2, ge=0)
    max_buffer_rows: int = setting(1_000_000, ge=1)
    max_unacked_bytes: int = setting(MAX_UNACKED_BYTES, ge=1)  # beyond this, un-acked envelopes move to the spool
    max_spool_bytes: int = setting(MAX_SPOOL_BYTES, ge=1)  # this process's spool files; beyond, the oldest go
    spool_after_s: float = setting(1.0, ge=0)  # disconnected this long -> spool instead of holding in memory
    backoff_initial_s: float = setting(0.1, ge=0)
    backoff_max_s: float = setting(5.0, ge=0)
    operator_error_retry_s: float = setting(30.0, ge=0)
    close_timeout_s: float = setting(5.0, ge=0)

    def validate(self) -> None:
        if not self.endpoint.strip():
            self.fail("endpoint", "must be host:port", self.endpoint)
        self.spool_dir = Path(self.spool_dir) if self.spool_dir else spool.default_dir()


class Client:
    """Background shipper for one rank process. ``start(hello)`` once the run
    identity is known; records added to ``buffer`` before that wait in it."""

    def __init__(self, config: ClientConfig, client_id: str, buffer: RecordBuffer) -> None:
        self.cfg = config
        self.client_id = client_id
        self.buffer = buffer
        self.run_id: str | None = None
        self.rank = 0
        self._seq = 0
        self._hello: pb.Envelope | None = None
        self._lock = threading.Lock()
        self._unacked: collections.OrderedDict[int, tuple[pb.Envelope, int, int]] = collections.OrderedDict()
        self._unacked_bytes = 0
        self._spooled: dict[Path, set[int]] = {}  # spool file -> seqs in it not yet acked
        self._spool_sizes: dict[Path, int] = {}  # spool file -> its bytes (max_spool_bytes)
        self._spooled_seq: dict[int, Path] = {}
        self._rows_of: dict[int, int] = {}  # spooled seq -> rows, for drop accounting
        self.dropped_rejected = 0
        self.dropped_unspooled = 0  # rows dropped, oldest first: the spool could not be written, or was full
        self.spool_dropped = 0  # of those, rows of spool files deleted beyond max_spool_bytes
        self._spool_error: str | None = None  # why the last spool write failed (said once per failure)
        self._spool_retry_at = 0.0
        self._stream: Stream | None = None
        self._connected_at: float | None = None
        self._disconnected_since = time.monotonic()
        self._outage_since = self._disconnected_since  # no ack since then (retries do not reset it)
        self._last_ack_at: float | None = None  # monotonic: the collector's last ack
        self._backoff = config.backoff_initial_s
        self._next_connect = 0.0
        self._operator_error_logged: set = set()
        self._outage_warned = False  # the collector's current outage has been reported
        self._last_error: str | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: grpc.Channel | None = None
        self._orphans_started = False
        self._end: pb.RunEnd | None = None  # set by close()
        self.acked = 0  # envelopes acked, for tests and RunEnd diagnostics
        self.on_request = None  # callable(pb.RankRequest), set by the watchdog; returns at once
        self._artifacts: collections.deque = collections.deque()  # pb.Artifact to send (send_artifact)

    # ---- called from the session (any thread) ----
    def start(self, hello: pb.Hello) -> None:
        self.run_id, self.rank = hello.run_id, hello.rank
        self._hello = self._envelope(hello=hello)
        self._track(self._hello, 0)
        self._outage_since = time.monotonic()  # the first try is about to be made
        self._thread = threading.Thread(target=self._run, name="rankscope-client", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Ask for a flush now (the buffer crossed batch_rows)."""
        self._wake.set()

    def send_artifact(self, artifact: pb.Artifact) -> None:
        """Ship a captured trace (collector.rank.capture) with the next flush, resent and spooled
        like any envelope until acked; safe from any thread."""
        self._artifacts.append(artifact)
        self._wake.set()

    def close(self, end: pb.RunEnd, timeout_s: float | None = None) -> bool:
        """Flush, send RunEnd, wait up to ``timeout_s`` for every ack, spool the
        rest. Returns True when everything was acknowledged."""
        if self._thread is None:
            return False
        self._end = end
        self._stopping.set()
        self._wake.set()
        self._thread.join((timeout_s if timeout_s is not None else self.cfg.close_timeout_s) + 2.0)
        if self._thread.is_alive():
            # past the wait for acks the thread only spools what is left: on a loaded machine
            # that can take seconds, and leaving now would lose those records at exit
            self._thread.join(15.0)
        return self._done.is_set() and not self._unacked and not self._spooled

    @property
    def pending(self) -> int:
        """Envelopes sent or spooled but not yet acknowledged."""
        return len(self._unacked) + len(self._spooled_seq)

    # ---- the client thread ----
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._wake.wait(self.cfg.flush_interval_s)
                self._wake.clear()
                self._step()
            self._finish()
        except Exception:
            log.exception("rankscope: telemetry client stopped; records from here on are not shipped")
        finally:
            self._done.set()

    def _step(self) -> None:
        try:
            for env in self._encode(self.buffer.take()):
                self._enqueue(env)
            self._send_artifacts()
        except Exception:
            log.exception("rankscope: could not encode records")
        self._maintain_connection()

    def _finish(self) -> None:
        start = time.monotonic()
        deadline = start + self.cfg.close_timeout_s
        # Out of reach for a while already: one more try (now, whatever the backoff says) for a
        # short grace, then spool, instead of waiting the whole close_timeout_s for acks.
        give_up = start + UNREACHABLE_CLOSE_S if self._unreachable() else None
        if give_up is not None:
            self._next_connect = 0.0
            # a fresh channel: the old one may sit in gRPC's own reconnect backoff (about a second
            # after an outage), which would fail the last try against a collector that is back
            if self._channel is not None and (self._stream is None or self._stream.dead.is_set()):
                self._channel.close()
                self._channel = None
        for env in self._encode(self.buffer.take()):
            self._enqueue(env)
        self._send_artifacts()
        # RunEnd goes last, once the data is acked (or most of the wait is spent),
        # so its dropped count includes batches the collector rejected.
        self._wait_acked(start + 0.8 * self.cfg.close_timeout_s, give_up)
        end = self._end
        end.dropped_records += self.buffer.dropped + self.dropped_rejected + self.dropped_unspooled
        self._enqueue(self._envelope(end=end))
        self._wait_acked(deadline, give_up)
        if self._stream is not None:
            self._stream.close()
            self._stream = None  # the call goes now, not in the interpreter's last collection
        with self._lock:
            if self._unacked:
                self._spool_unacked()
        if self._spooled:
            log.warning(
                "rankscope: collector at %s did not acknowledge %d envelope(s); they are spooled in %s",
                self.cfg.endpoint,
                len(self._spooled_seq),
                self.cfg.spool_dir,
            )
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _send_artifacts(self) -> None:
        while self._artifacts:
            self._enqueue(self._envelope(artifact=self._artifacts.popleft()))

    def _wait_acked(self, deadline: float, give_up: float | None = None) -> None:
        """Until every envelope is acked or ``deadline``; past ``give_up`` too, while the collector
        has not acked anything since its outage began and no stream is open (a stream still
        open may be a collector that just came back: its acks are waited for)."""
        while time.monotonic() < deadline and (self._unacked or self._spooled):
            if give_up is not None and self._connected_at is None and time.monotonic() >= give_up:
                stream = self._stream
                if stream is None or stream.dead.is_set():
                    return
            self._maintain_connection()
            self._wake.wait(0.05)
            self._wake.clear()

    def _unreachable(self) -> bool:
        """No ack since the last connection broke (or ever), for longer than spool_after_s."""
        return self._connected_at is None and time.monotonic() - self._outage_since > max(
            self.cfg.spool_after_s, UNREACHABLE_CLOSE_S
        )

    def _warn_if_unreachable(self) -> None:
        """Once per outage, UNREACHABLE_WARN_S after it began: the endpoint, why, and where the
        records wait, while the run goes on (not only at exit)."""
        if self._outage_warned or self._connected_at is not None or self._stopping.is_set():
            return
        away = time.monotonic() - self._outage_since
        if away < UNREACHABLE_WARN_S:
            return
        self._outage_warned = True
        if self._last_ack_at is not None and self._unacked:
            # a cut the keepalive took ~20 s to notice: records went unanswered since the last ack, not
            # only since the connection was seen to break
            away = max(away, time.monotonic() - self._last_ack_at)
        log.warning(
            "rankscope: collector at %s has not answered for %.0f s (%s); training goes on, its records are "
            "spooled in %s and resent when the collector is back",
            self.cfg.endpoint,
            away,
            self._last_error or "no answer",
            self.cfg.spool_dir,
        )

    def _envelope(self, **body) -> pb.Envelope:
        self._seq += 1
        return pb.Envelope(schema_version=SCHEMA_VERSION, client_id=self.client_id, seq=self._seq, **body)

    def _encode(self, chunks) -> list[pb.Envelope]:
        """Chunks -> envelopes of at most batch_rows rows, same-table chunks merged."""
        merged: dict[tuple, list] = {}
        for table, cols, rows in chunks:
            merged.setdefault((table, tuple(cols)), []).append((cols, rows))
        out = []
        for (table, keys), parts in merged.items():
            cols = {k: [v for c, _ in parts for v in c[k]] for k in keys}
            total = sum(r for _, r in parts)
            for lo in range(0, total, self.cfg.batch_rows):
                piece = {k: v[lo : lo + self.cfg.batch_rows] for k, v in cols.items()}
                n = min(self.cfg.batch_rows, total - lo)
                batch = self._encode_batch(table, piece, n)
                if batch is not None:
                    env = self._envelope(table=batch)
                    self._rows_of[env.seq] = batch.rows
                    out.append(env)
        return out

    def _encode_batch(self, table: str, cols: dict, n: int):
        try:
            return codec.encode_batch(table, self.run_id, self.rank, cols)
        except Exception as e:
            # A bad value (e.g. a string in a number column): keep the good rows.
            good = []
            for i in range(n):
                row = {k: [v[i]] for k, v in cols.items()}
                try:
                    codec.encode_batch(table, self.run_id, self.rank, row)
                    good.append(i)
                except Exception:
                    pass
            self.buffer.dropped += n - len(good)
            log.warning("rankscope: dropped %d %s row(s) that do not fit the schema: %s", n - len(good), table, e)
            if not good:
                return None
            return codec.encode_batch(table, self.run_id, self.rank, {k: [v[i] for i in good] for k, v in cols.items()})

    def _track(self, env: pb.Envelope, rows: int) -> None:
        size = env.ByteSize()
        with self._lock:
            self._unacked[env.seq] = (env, size, rows)
            self._unacked_bytes += size

    def _enqueue(self, env: pb.Envelope) -> None:
        self._track(env, self._rows_of.pop(env.seq, 0))
        if self._stream is not None and not self._stream.dead.is_set():
            self._stream.send(env)

    def _maintain_connection(self) -> None:
        stream = self._stream
        if stream is not None and stream.dead.is_set():
            self._on_stream_error(stream.error)
            stream.close()
            self._stream = stream = None
            self._disconnected_since = time.monotonic()
        if stream is None:
            with self._lock:
                over_memory = self._unacked_bytes > self.cfg.max_unacked_bytes
                away = time.monotonic() - self._disconnected_since > self.cfg.spool_after_s
                if self._unacked and (over_memory or away or self._stopping.is_set()):
                    self._spool_unacked()
            if time.monotonic() >= self._next_connect:
                self._connect()
        elif self._unacked_bytes > self.cfg.max_unacked_bytes:
            # Connected but the collector is slow: keep memory bounded.
            with self._lock:
                self._spool_unacked()
        self._warn_if_unreachable()  # no stream, or one on which nothing has been acked

    def _connect(self) -> None:
        try:
            if self._channel is None:
                self._channel = security.open_channel(
                    self.cfg.endpoint, tls_ca=self.cfg.tls_ca, options=security.channel_options(CHANNEL_OPTIONS)
                )
            metadata = security.auth_metadata(self.cfg.token)
            stream = Stream(
                pb_grpc.CollectorStub(self._channel),
                metadata,
                on_ack=self._on_ack,
                envelopes_of=self._spooled_envelopes,
                on_dead=self._wake.set,
                on_request=lambda request: self.on_request is not None and self.on_request(request),
            )
        except Exception as e:
            self._on_stream_error(e)
            return
        self._stream = stream
        # Hello first on every stream (the collector may key the stream on it),
        # then spooled files, then what is held in memory, all in seq order.
        stream.send(self._hello)
        with self._lock:
            for path in sorted(self._spooled):
                stream.send(path)
            for seq, (env, _, _) in self._unacked.items():
                if seq != self._hello.seq:
                    stream.send(env)

    def _on_stream_error(self, err) -> None:
        code = err.code() if isinstance(err, grpc.RpcError) and hasattr(err, "code") else None
        now = time.monotonic()
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            seq = rejected_seq(err)
            detail = err.details() if hasattr(err, "details") else str(err)
            if seq is not None:
                self._drop_rejected(seq, detail)
            else:
                log.error("rankscope: collector rejected a batch without naming it: %s", detail)
            self._next_connect = now  # the rest is fine: resend right away
            return
        if code in _OPERATOR_ERRORS:
            if code not in self._operator_error_logged:
                self._operator_error_logged.add(code)
                detail = err.details() if hasattr(err, "details") else str(err)
                log.error(
                    "rankscope: collector at %s refused this client (%s: %s); records are spooled to %s "
                    "and retried every %.0f s",
                    self.cfg.endpoint,
                    code.name,
                    detail,
                    self.cfg.spool_dir,
                    self.cfg.operator_error_retry_s,
                )
            self._next_connect = now + self.cfg.operator_error_retry_s
            self._outage_warned = True  # the refusal was just reported, with the endpoint and the spool dir
            return
        self._last_error = code.name if code else str(err)[:200]
        if self._connected_at is not None:  # an outage begins
            self._outage_since = now
        if self._connected_at is None and self._backoff <= self.cfg.backoff_initial_s:
            log.info(
                "rankscope: collector at %s unreachable (%s); retrying with backoff, spooling to %s",
                self.cfg.endpoint,
                code.name if code else err,
                self.cfg.spool_dir,
            )
        self._connected_at = None
        self._next_connect = now + self._backoff * random.uniform(0.8, 1.2)
        self._backoff = min(self._backoff * 2, self.cfg.backoff_max_s)

    def _drop_rejected(self, seq: int, detail: str) -> None:
        with self._lock:
            held = self._unacked.pop(seq, None)
            rows = 0
            if held is not None:
                self._unacked_bytes -= held[1]
                rows = held[2]
            elif seq in self._spooled_seq:
                rows = self._rows_of.pop(seq, 0)
                self._forget_spooled(seq)
        self.dropped_rejected += rows
        log.error("rankscope: collector rejected envelope seq=%d (%d rows dropped): %s", seq, rows, detail)
        if held is not None and held[0].HasField("hello"):
            log.error("rankscope: the Hello was rejected; nothing from this rank can be stored")

    # ---- acks (reader thread) ----
    def _on_ack(self, seqs) -> None:
        self._last_ack_at = time.monotonic()
        with self._lock:
            for seq in seqs:
                held = self._unacked.pop(seq, None)
                if held is not None:
                    self._unacked_bytes -= held[1]
                    self.acked += 1
                elif seq in self._spooled_seq:
                    self._forget_spooled(seq)
                    self.acked += 1
        if self._connected_at is None:
            self._connected_at = time.monotonic()
            self._backoff = self.cfg.backoff_initial_s
            if self._outage_warned:
                self._outage_warned = False
                log.warning(
                    "rankscope: collector at %s is answering again; resending what was spooled", self.cfg.endpoint
                )
            if not self._orphans_started:
                # The collector is reachable: deliver what dead processes on this host left behind.
                self._orphans_started = True
                threading.Thread(
                    target=resend_spooled,
                    args=(self.cfg.spool_dir, self.cfg.endpoint, self.cfg.token),
                    kwargs={"tls_ca": self.cfg.tls_ca},
                    name="rankscope-orphans",
                    daemon=True,
                ).start()
        if self._stopping.is_set():
            self._wake.set()

    # ---- spool (callers hold self._lock) ----
    def _spool_unacked(self) -> None:
        if self._spool_error is not None and time.monotonic() < self._spool_retry_at:
            self._keep_in_memory(None)  # not every flush: a failing write of all that is held costs
            return
        envs = [env for env, _, _ in self._unacked.values()]
        try:
            path = spool.write(self.cfg.spool_dir, self.client_id, envs, self.cfg.endpoint)
        except OSError as e:
            self._spool_retry_at = time.monotonic() + SPOOL_RETRY_S
            self._keep_in_memory(e)
            return
        if self._spool_error is not None:
            self._spool_error = None
            log.warning("rankscope: spooling to %s works again", self.cfg.spool_dir)
        seqs = set()
        for seq, (_, _, rows) in self._unacked.items():
            seqs.add(seq)
            self._spooled_seq[seq] = path
            self._rows_of[seq] = rows
        self._spooled[path] = seqs
        self._spool_sizes[path] = _size(path)
        self._unacked.clear()
        self._unacked_bytes = 0
        self._cap_spool()

    def _cap_spool(self) -> None:
        """Beyond max_spool_bytes of this process's spool files, delete the oldest (never the newest:
        what was just written is kept), their rows counted in dropped_unspooled and said once."""
        dropped = 0
        while sum(self._spool_sizes.values()) > self.cfg.max_spool_bytes and len(self._spooled) > 1:
            oldest = min(self._spooled)  # names sort in seq order
            for seq in list(self._spooled[oldest]):
                dropped += self._rows_of.get(seq, 0)
                self._forget_spooled(seq)
        if dropped:
            if not self.spool_dropped:
                log.warning(
                    "rankscope: the spool for the collector at %s is over %d bytes: dropping its oldest records "
                    "(counted in the run's dropped records)",
                    self.cfg.endpoint,
                    self.cfg.max_spool_bytes,
                )
            self.spool_dropped += dropped
            self.dropped_unspooled += dropped

    def _keep_in_memory(self, error: OSError | None) -> None:
        """The spool cannot be written: hold envelopes in memory, the oldest dropped beyond
        max_unacked_bytes (the Hello never: without it nothing of the rank is stored)."""
        if self._spool_error is None and error is not None:
            self._spool_error = str(error)
            log.error(
                "rankscope: cannot spool: %s; un-acked records stay in memory (up to %d bytes, the oldest dropped "
                "and counted beyond that) until the collector takes them",
                error if isinstance(error, spool.UnsafeSpoolDir) else f"{self.cfg.spool_dir}: {error}",
                self.cfg.max_unacked_bytes,
            )
        dropped = 0
        for seq in list(self._unacked):
            if self._unacked_bytes <= self.cfg.max_unacked_bytes:
                break
            if seq == self._hello.seq:
                continue
            _, size, rows = self._unacked.pop(seq)
            self._unacked_bytes -= size
            dropped += rows
        if dropped:
            if not self.dropped_unspooled:
                log.warning(
                    "rankscope: dropping the oldest un-acked records: the collector at %s does not take them and the "
                    "spool cannot hold them (counted in the run's dropped records)",
                    self.cfg.endpoint,
                )
            self.dropped_unspooled += dropped

    def _forget_spooled(self, seq: int) -> None:
        path = self._spooled_seq.pop(seq)
        self._rows_of.pop(seq, None)
        left = self._spooled[path]
        left.discard(seq)
        if not left:
            del self._spooled[path]
            self._spool_sizes.pop(path, None)
            try:
                path.unlink()
            except OSError:
                pass

    def _spooled_envelopes(self, path: Path):
        """Called by the request iterator: the file's envelopes not yet acked."""
        with self._lock:
            left = set(self._spooled.get(path, ()))
        if not left:  # acked meanwhile, or dropped beyond max_spool_bytes
            return []
        try:
            envs, _ = spool.scan(path)  # an undecodable record stays in the file: resend_spooled sets it aside
        except (OSError, spool.SpoolError) as e:
            log.error("rankscope: cannot read spool file: %s", e)
            return []
        return [e for e in envs if e.seq in left]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
