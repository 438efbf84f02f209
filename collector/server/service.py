"""The gRPC collector: validates envelopes, hands rows to the store, acks when durable.

One bidi ``Stream`` per rank process. A reader task per stream validates and
submits envelopes while the handler coroutine sends back ``Ack``s as the store's
commits complete, so a client never waits for an ack before sending more.

Bad input ends only the stream that sent it, with a status naming the problem:

- schema_version other than 1          -> FAILED_PRECONDITION (both versions named)
- undecodable batch, bad run_id/rank,
  unknown table or column, empty body,
  a batch decoding past its bound,
  an impossible value, an over-long
  Hello string (collector.data.codec),
  a run or rank not this stream's      -> INVALID_ARGUMENT, message names the seq (and the column,
                                          row or field); trailing metadata ``rankscope-rejected-seq``
- bytes that are no Envelope at all    -> INVALID_ARGUMENT ("message N ... cannot be decoded"),
  (also for Health's request)             no seq to name; decoded by us, not by gRPC, which
                                          would answer INTERNAL (and wedge server.stop)
- message over MAX_MESSAGE_BYTES       -> RESOURCE_EXHAUSTED (refused by gRPC itself)
- missing/wrong bearer token           -> UNAUTHENTICATED (before any message is read or decoded)

Envelopes accepted before a bad one are still committed and acked before the
stream is closed; other streams are unaffected.

Stream identity. A stream speaks for one rank of one run: the (run_id, rank) its Hello
declared (the Hello itself checks rank < world_size). Its batches and its RunEnd must name
that run and rank, and a second Hello on it the same ones; anything else is refused with
INVALID_ARGUMENT naming both (so the client drops that envelope, as for any refused one) and
nothing of it is stored. A stream that sends no Hello (a spool file of a dead rank resent by
another process, written after its Hello was acked) speaks for the (run, rank) that its
client_id's Hello declared, when this collector has seen that Hello (collector.server.state
remembers ``CLIENT_IDENTITIES`` of them); otherwise for the first (run, rank) it sends, whose
rank must be inside the run's world size when a Hello of the run was seen.

Liveness (collector.server.liveness) sees every accepted envelope and every stream's
end, and may ask a rank for its stacks: such requests ride back on the stream's Acks
(``Ack.requests``), sent by the handler coroutine like the acks themselves. So do commands
(collector.server.commands: profile, stacks, memory), asked through the ``Command`` RPC or by
the escalation; a rank's ``Artifact`` envelope (its captured trace) is written under the data
dir and recorded in ``artifacts`` (collector.server.artifacts).

The service runs on grpc.aio, one event loop in its own thread (``CollectorServer``):
an open stream is a coroutine, not a thread, so idle streams cannot exhaust anything
``Health`` or a real rank needs. Nothing blocking runs on the loop: decoding, the
dedupe lookup and the store's submit (which blocks under back-pressure) run on a small
intake pool (``INTAKE_THREADS``), one envelope per stream at a time; commits run on the
store's own threads and wake the stream's coroutine when they are durable. The
limits on what a stream or a peer may hold (idle timeout, streams per peer, rows and
bytes per second) are collector.server.limits'. ``create_server`` builds a collector, not yet
started; ``serve`` (collector.server.serve) runs one from its settings until told to stop.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import grpc
from google.protobuf.message import DecodeError

from collector.data import security
from collector.data.codec import (
    REJECTED_SEQ_KEY,
    RESEND_KEY,
    CodecError,
    SchemaVersionError,
    check_header,
    envelope_rows,
)
from collector.data.deliveries import FLUSH_GAP_NS, delivery_row
from collector.server import artifacts, resends
from collector.server.auth import BearerTokenInterceptor
from collector.server.compaction import CompactionConfig
from collector.server.limits import StreamBudget, StreamLimits, peer_host
from collector.server.state import CollectorState
from collector.server.store import StoreClosed, StoreConfig
from proto import SCHEMA_VERSION, pb

log = logging.getLogger(__name__)

# Largest accepted Envelope. A comm record is ~100 bytes on the wire, so this is
# ~600k records per batch; clients batch far smaller. Larger messages are refused
# by gRPC with RESOURCE_EXHAUSTED before they reach the servicer.
MAX_MESSAGE_BYTES = 64 << 20
REFUSAL_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
# Threads that decode envelopes and hand them to the store. pyarrow releases the GIL
# while decoding, and a submit may block on the store's back-pressure: a few threads
# keep every core busy without one thread per stream.
INTAKE_THREADS = 8
PENDING_CALLS = 1 << 16
PENDING_CALL_MAX_S = 600  # a rank waits this long to be taken up in a connect storm, not 30 s
PING_MIN_INTERVAL_MS = 5_000  # below the ranks' keepalive (collector.rank.client.KEEPALIVE_S: 10 s)

try:
    SERVER_VERSION = importlib.metadata.version("rankscope")
except importlib.metadata.PackageNotFoundError:  # running from a bare checkout
    SERVER_VERSION = "unknown"


class StreamError(Exception):
    """Why a stream ends with an error status: a refused envelope (bad input) or a
    collector that cannot take it now (shutting down, storage failure)."""

    def __init__(self, code: grpc.StatusCode, message: str, seq: int):
        super().__init__(message)
        self.code, self.message, self.seq = code, message, seq


class Undecodable:
    """What a request deserializer hands the servicer for bytes that do not parse."""

    __slots__ = ("problem",)

    def __init__(self, problem: str):
        self.problem = problem


def _lenient(message_type):
    """A deserializer that never raises: undecodable bytes become ``Undecodable``."""

    def parse(raw: bytes):
        try:
            return message_type.FromString(raw)
        except DecodeError as exc:
            return Undecodable(f"{len(raw)} bytes cannot be decoded as a {message_type.__name__} ({exc})")

    return parse


class _StreamAcks:
    """What one stream's reader (on the loop), the store's commits and liveness (on their
    own threads) tell the stream's writer coroutine. State under a lock; every change
    wakes the writer through the loop (``call_soon_threadsafe``), whichever thread made it."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._changed = asyncio.Event()
        self.acked: list[int] = []
        self.requests: list[pb.RankRequest] = []  # for the rank, sent with the next Ack
        self.outstanding = 0  # submitted, not yet durable
        self.handling = False  # the reader holds a message (throttled or being submitted)
        self.reading = True
        self.error: StreamError | None = None
        self.last_message = loop.time()
        # (run_id, rank) this stream speaks for, and what said so; set by the intake thread
        # handling its envelopes (one at a time)
        self.identity: tuple[str, int] | None = None
        self.identity_from = ""
        self.received_ns = 0  # when its last table envelope arrived (collector.data.deliveries)
        self.resend = False  # it carries spool files of exited processes (collector.server.resends)
        self.peer = ""  # the rank's address as this collector sees it (a link probe reaches it there)

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._changed.set)
        except RuntimeError:  # the loop is closed: the collector has stopped, nobody is waiting
            pass

    def submitted(self) -> None:
        with self._lock:
            self.outstanding += 1

    def withdraw(self) -> None:
        """A submission that did not happen after all."""
        with self._lock:
            self.outstanding -= 1
        self._wake()

    def durable(self, seq: int, error: BaseException | None) -> None:
        with self._lock:
            self.outstanding -= 1
            if error is None:
                self.acked.append(seq)
            elif self.error is None:
                self.error = StreamError(
                    grpc.StatusCode.UNAVAILABLE, f"envelope seq {seq} could not be stored ({error}); resend it", seq
                )
        self._wake()

    def stop_reading(self, error: StreamError | None = None) -> None:
        with self._lock:
            self.reading = False
            if error is not None and self.error is None:
                self.error = error
        self._wake()

    def request(self, request: pb.RankRequest) -> None:
        """Ask the rank something (liveness.RankStream); sent on the next Ack, at once."""
        with self._lock:
            self.requests.append(request)
        self._wake()

    def _ended(self) -> bool:
        # A storage error ends the stream without waiting for the client to stop sending.
        return (not self.reading or self.error is not None) and self.outstanding == 0

    async def next_acks(self, idle_timeout_s: float) -> pb.Ack:
        """The next Ack (seqs durable now, requests for the rank); an empty Ack once all is
        acked and reading ended (or failed, or the stream was idle for ``idle_timeout_s``)."""
        while True:
            self._changed.clear()  # before looking: a change made after the look sets it again
            with self._lock:
                if self.acked or self.requests or self._ended():
                    acked, self.acked = self.acked, []
                    requests, self.requests = self.requests, []
                    return pb.Ack(seqs=acked, requests=requests)
                busy = self.handling or self.outstanding
            idle_left = idle_timeout_s - (self._loop.time() - self.last_message)
            if not busy and idle_left <= 0:
                self.stop_reading(
                    StreamError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"no message for {idle_timeout_s:g} s (--stream-idle-timeout); reconnect to send more",
                        0,
                    )
                )
                continue
            try:
                await asyncio.wait_for(self._changed.wait(), idle_left if not busy else idle_timeout_s)
            except TimeoutError:
                pass


class CollectorServicer:
    """The Collector service's two methods, as grpc.aio handlers."""

    def __init__(self, state: CollectorState, intake: ThreadPoolExecutor):
        self.state = state
        self.intake = intake

    async def Stream(self, request_iterator, context):
        peer = peer_host(context.peer() or "unknown")
        resend = any(key == RESEND_KEY for key, _ in context.invocation_metadata() or ())
        if resend and not self.state.limits.resends:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, resends.REFUSED)
        refusal = self.state.peers.open(peer)
        if refusal is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        loop = asyncio.get_running_loop()
        acks = _StreamAcks(loop)
        acks.resend, acks.peer = resend, peer
        self.state.count(streams=1)
        reader = asyncio.create_task(self._read(request_iterator, acks))
        try:
            while (ack := await acks.next_acks(self.state.limits.idle_timeout_s)).seqs or ack.requests:
                await context.write(ack)
            if acks.error is not None:
                err = acks.error
                if err.code in REFUSAL_CODES and err.seq:  # seq 0 names no real envelope
                    # the client must not resend this one as is
                    context.set_trailing_metadata(((REJECTED_SEQ_KEY, str(err.seq)),))
                await context.abort(err.code, err.message)
        finally:
            reader.cancel()
            self.state.count(streams=-1)
            self.state.peers.close(peer)
            # closed() may store a rank event, and a store submit can block: not on the loop
            try:
                self.intake.submit(self.state.liveness.closed, acks)
                if resend:  # saves a small file: not on the loop
                    self.intake.submit(self.state.resends.stream_ended)
            except RuntimeError:  # the intake pool is shut down: the collector is stopping
                self.state.liveness.closed(acks)

    async def _read(self, request_iterator, acks: _StreamAcks) -> None:
        loop = asyncio.get_running_loop()
        budget = StreamBudget(self.state.limits, loop.time())
        received = 0
        try:
            async for env in request_iterator:
                acks.last_message = loop.time()
                received += 1
                if isinstance(env, Undecodable):
                    self.state.count(rejected=1)
                    acks.stop_reading(
                        StreamError(
                            grpc.StatusCode.INVALID_ARGUMENT, f"message {received} on this stream: {env.problem}", 0
                        )
                    )
                    return
                acks.handling = True
                if (wait := budget.wait_s(loop.time())) > 0:
                    await asyncio.sleep(wait)  # over budget: stop reading, flow control holds the sender
                budget.spend(env.table.rows if env.HasField("table") else 1, env.ByteSize(), loop.time())
                error = await loop.run_in_executor(self.intake, self._accept, env, acks)
                acks.handling, acks.last_message = False, loop.time()
                if error is not None:
                    acks.stop_reading(error)
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away mid-stream; what it sent is kept
            log.debug("stream ended: %r", exc)
        acks.stop_reading()

    def _accept(self, env: pb.Envelope, acks: _StreamAcks) -> StreamError | None:
        """Check, decode and submit one envelope (on an intake thread); the error that
        ends the stream, if any."""
        try:
            self._submit(env, acks)
        except StreamError as rejected:
            self.state.count(rejected=1)
            log.info("rejected: %s", rejected.message)
            return rejected
        except StoreClosed as exc:
            return StreamError(grpc.StatusCode.UNAVAILABLE, str(exc), env.seq)
        except Exception as exc:  # a collector bug, not bad input: say so, keep serving others
            log.exception("envelope seq %d", env.seq)
            return StreamError(grpc.StatusCode.INTERNAL, f"envelope seq {env.seq}: collector error {exc!r}", env.seq)
        return None

    def _check_identity(self, env: pb.Envelope, acks: _StreamAcks) -> None:
        """The envelope speaks for the run and rank this stream does (see the module's docstring)."""
        body = env.WhichOneof("body")
        if body not in ("hello", "table", "end", "artifact"):
            return  # no body: the codec refuses it
        part = getattr(env, body)
        claimed = (part.run_id, part.rank)
        if acks.identity is None:
            if body == "hello":
                return  # bound once the Hello is accepted
            known = self.state.identity_of(env.client_id)
            if known is not None:
                acks.identity, acks.identity_from = known, f"the Hello of client {env.client_id!r}"
            else:
                world = self.state.world_size_of(part.run_id)
                if world is not None and not 0 <= part.rank < world:
                    raise StreamError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"envelope seq {env.seq}: {body} for rank {part.rank} of run {part.run_id!r}, "
                        f"whose Hello declared world_size {world}",
                        env.seq,
                    )
                acks.identity, acks.identity_from = claimed, "its first envelope (no Hello)"
        if claimed != acks.identity:
            run, rank = acks.identity
            raise StreamError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"envelope seq {env.seq}: this stream speaks for run {run!r} rank {rank} (by {acks.identity_from}); "
                f"its {body} names run {part.run_id!r} rank {part.rank}: one stream per rank and run, "
                "each opened by that rank's Hello",
                env.seq,
            )

    def _submit(self, env: pb.Envelope, acks: _StreamAcks) -> None:
        store = self.state.store
        try:
            check_header(env)
            # A resend of something durable is acked without decoding it again.
            if store.is_durable(env.client_id, env.seq):
                rows = []
            elif env.HasField("artifact"):  # its file is written only for the stream's own run and rank
                artifacts.check(env.artifact, env.seq)
                self._check_identity(env, acks)
                rows = artifacts.stored_rows(self.state.data_dir, env)
            else:
                rows = envelope_rows(env)
                if env.HasField("table") and rows:  # when it arrived: a slow link's side (collector.data.deliveries)
                    now = time.time_ns()
                    first_of_flush = now - acks.received_ns > FLUSH_GAP_NS  # it stands for its flush
                    acks.received_ns = now
                    if first_of_flush:
                        row = delivery_row(env.table.table, env.table.rank, rows[0][2], now)
                        rows += [("deliveries", env.table.run_id, row)] if row is not None else []
            self._check_identity(env, acks)  # after the codec: a malformed run_id is named as such
        except SchemaVersionError as exc:
            raise StreamError(grpc.StatusCode.FAILED_PRECONDITION, str(exc), env.seq) from None
        except CodecError as exc:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, str(exc), env.seq) from None
        if env.HasField("hello"):
            self.state.said_hello(env.client_id, env.hello)
            if acks.identity is None:
                acks.identity, acks.identity_from = (env.hello.run_id, env.hello.rank), "its Hello"
        acks.submitted()
        durable = partial(acks.durable, env.seq)
        if acks.resend and env.HasField("table") and rows:  # counted once durable (a kill before: resent again)
            durable = partial(_count_resent, self.state.resends, env.table.run_id, env.table.rows, durable)
        try:
            store.submit(env.client_id, env.seq, rows, durable)
        except BaseException:
            acks.withdraw()
            raise
        self.state.liveness.observe(acks, env, rows)  # a resent Hello too: it names the rank's new stream
        if env.HasField("table") and env.table.table == "probes":
            self.state.prober.observe(rows)  # a link probe waits for its answers

    async def Command(self, request, context):
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"command: {request.problem}")
        try:
            roles = dict.fromkeys(request.references, "reference")
            return self.state.commands.send(request.run_id, request.ranks, request.request, roles=roles)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"command: {exc}")

    async def Probe(self, request, context):
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"probe: {request.problem}")
        run = partial(self.state.prober.run, request.run_id, list(request.hosts), request.bytes, request.timeout_s)
        try:
            report = await asyncio.get_running_loop().run_in_executor(None, run)  # seconds: not on the loop
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"probe: {exc}")
        return pb.ProbeReply(
            request_id=report.request_id, report_json=json.dumps(report.to_json()), refused=report.refused
        )

    async def Health(self, request, context):
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"health request: {request.problem}")
        s = self.state
        reply = pb.HealthReply(
            schema_version=SCHEMA_VERSION,
            server_version=SERVER_VERSION,
            uptime_s=time.monotonic() - s.started,
            open_streams=s.open_streams,
            records_durable=s.store.records_durable,
            batches_rejected=s.batches_rejected,
        )
        if request.run:  # the findings held in memory (collector.server.live_findings)
            run_id, held, found, age_s = s.findings.answer(request.run)
            reply.run_id, reply.held, reply.findings_age_s = run_id or "", held, age_s
            if held:
                reply.findings_json = json.dumps(s.findings.as_json(run_id, found), default=str)
                reply.evidence_json = json.dumps(s.findings.captured(run_id), default=str)
        return reply


def _count_resent(resent, run_id: str, records: int, then, error: BaseException | None) -> None:
    if error is None:
        resent.stored(run_id, records)
    then(error)


def _add_servicer(servicer: CollectorServicer, server: grpc.aio.Server) -> None:
    """Like pb_grpc.add_CollectorServicer_to_server, with lenient request decoding."""
    handlers = {
        "Stream": grpc.stream_stream_rpc_method_handler(
            servicer.Stream, request_deserializer=_lenient(pb.Envelope), response_serializer=pb.Ack.SerializeToString
        ),
        "Command": grpc.unary_unary_rpc_method_handler(
            servicer.Command,
            request_deserializer=_lenient(pb.CommandRequest),
            response_serializer=pb.CommandReply.SerializeToString,
        ),
        "Probe": grpc.unary_unary_rpc_method_handler(
            servicer.Probe,
            request_deserializer=_lenient(pb.ProbeRequest),
            response_serializer=pb.ProbeReply.SerializeToString,
        ),
        "Health": grpc.unary_unary_rpc_method_handler(
            servicer.Health,
            request_deserializer=_lenient(pb.HealthRequest),
            response_serializer=pb.HealthReply.SerializeToString,
        ),
    }
    service = pb.DESCRIPTOR.services_by_name["Collector"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))


class CollectorServer:
    """The grpc.aio server on its own event loop thread, driven from synchronous code
    like a ``grpc.Server``: ``start()``, ``stop(grace)`` (returns an event that is set,
    for ``.wait()``), ``wait_for_termination()``."""

    def __init__(
        self, state: CollectorState, address: str, token: str | None, credentials: grpc.ServerCredentials | None
    ):
        self.state = state
        state.prober.bind_host = address.rpartition(":")[0]  # a link probe's listener binds where the collector does
        self.intake = ThreadPoolExecutor(INTAKE_THREADS, thread_name_prefix="rankscope-intake")
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rankscope-grpc", daemon=True)
        self._thread.start()
        self._stopped = threading.Event()
        try:
            self.server, self.port = self._call(self._build(address, token, credentials))
        except BaseException:
            self._shut_down()
            raise

    def _call(self, coro, timeout: float | None = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _build(self, address, token, credentials) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(
            interceptors=[BearerTokenInterceptor(token)] if token else [],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # Calls that arrived but that the loop has not taken up yet. gRPC's defaults (refused
                # from 1,000 pending on, cancelled after 30 s pending) turned thousands of ranks
                # connecting at once into ~3,000 failed stream attempts of 4,096 on 2 busy cores.
                ("grpc.server.max_pending_requests", PENDING_CALLS),
                ("grpc.server.max_pending_requests_hard_limit", PENDING_CALLS),
                ("grpc.server_max_unrequested_time_in_server", PENDING_CALL_MAX_S),
                # ranks ping every client.KEEPALIVE_S to notice a partition (a stalled stream sends no
                # data); gRPC's default answers pings more often than every 5 min with GOAWAY
                ("grpc.http2.min_recv_ping_interval_without_data_ms", PING_MIN_INTERVAL_MS),
                ("grpc.http2.max_ping_strikes", 0),
            ],
        )
        _add_servicer(CollectorServicer(self.state, self.intake), server)
        try:
            port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        except RuntimeError:
            port = 0
        if port == 0:
            raise OSError(f"cannot listen on {address}: address in use or invalid")
        return server, port

    def start(self) -> None:
        self._call(self.server.start())

    def stop(self, grace: float | None = None) -> threading.Event:
        """Refuse new calls, give open ones ``grace`` seconds, cancel the rest; returns once stopped."""
        if not self._stopped.is_set():
            try:
                self._call(self.server.stop(grace), timeout=None if grace is None else grace + 30)
            finally:
                self._shut_down()
        return self._stopped

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def _shut_down(self) -> None:
        async def cancel_tasks():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self._call(cancel_tasks(), timeout=10)
        except Exception:  # a task that will not end must not keep the collector from stopping
            log.warning("collector: tasks still running at shutdown", exc_info=True)
        # submissions in flight finish (their acks are dropped) before the loop goes away
        self.intake.shutdown(wait=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
        self._stopped.set()


# -- entry points ----------------------------------------------------------------


def create_server(
    address: str,
    data_dir,
    token: str | None = None,
    *,
    store_config: StoreConfig | None = None,
    compaction_config: CompactionConfig | None = None,
    stream_limits: StreamLimits | None = None,
    tls: security.ServerTLS | None = None,
    writer: str | None = None,
) -> tuple[CollectorServer, int, CollectorState]:
    """A collector bound to ``address`` (port 0 picks one), not yet started; with
    ``tls`` it speaks TLS only. The bind policy is the settings' (collector.server.settings).
    ``writer``: this collector's id when several share ``data_dir`` (docs/SCALING.md)."""
    credentials = tls.credentials() if tls is not None else None  # bad files fail before the data dir is taken
    state = CollectorState(data_dir, store_config, compaction_config, writer, stream_limits)
    try:
        server = CollectorServer(state, address, token, credentials)
    except BaseException:
        state.close()
        raise
    return server, server.port, state
