"""The gRPC collector: validates envelopes, hands rows to the store, acks when durable.

One bidi ``Stream`` per rank process. A reader thread per stream validates and
submits envelopes while the handler thread sends back ``Ack``s as the store's
commits complete, so a client never waits for an ack before sending more.

Bad input ends only the stream that sent it, with a status naming the problem:

- schema_version other than 1          -> FAILED_PRECONDITION (both versions named)
- undecodable batch, bad run_id/rank,
  unknown table or column, empty body  -> INVALID_ARGUMENT, message names the seq;
                                          trailing metadata ``rankscope-rejected-seq``
- bytes that are no Envelope at all    -> INVALID_ARGUMENT ("message N ... cannot be decoded"),
  (also for Health's request)             no seq to name; decoded by us, not by gRPC, which
                                          would answer INTERNAL (and wedge server.stop)
- message over MAX_MESSAGE_BYTES       -> RESOURCE_EXHAUSTED (refused by gRPC itself)
- missing/wrong bearer token           -> UNAUTHENTICATED (before any message is read or decoded)

Envelopes accepted before a bad one are still committed and acked before the
stream is closed; other streams are unaffected.

Liveness (collector.server.liveness) sees every accepted envelope and every stream's
end, and may ask a rank for its stacks: such requests ride back on the stream's Acks
(``Ack.requests``), sent by the handler thread like the acks themselves.

Each stream holds two threads (the handler from the pool and its reader), so
the pool allows ``max_workers // 2`` concurrent streams; more are refused with
RESOURCE_EXHAUSTED by gRPC.
"""

from __future__ import annotations

import hmac
import importlib.metadata
import logging
import signal
import sys
import threading
import time
from concurrent import futures
from functools import partial
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from collector.data import catalog, security
from collector.data.codec import REJECTED_SEQ_KEY, CodecError, SchemaVersionError, check_header, envelope_rows
from collector.server.compaction import CompactionConfig, Compactor
from collector.server.ledger import DataDirBusy
from collector.server.liveness import Liveness
from collector.server.store import Store, StoreClosed, StoreConfig
from proto import SCHEMA_VERSION, pb, pb_grpc

log = logging.getLogger(__name__)

# Largest accepted Envelope. A comm record is ~100 bytes on the wire, so this is
# ~600k records per batch; clients batch far smaller. Larger messages are refused
# by gRPC with RESOURCE_EXHAUSTED before they reach the servicer.
MAX_MESSAGE_BYTES = 64 << 20
REFUSAL_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)

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


# -- collector state -------------------------------------------------------------


class CollectorState:
    """The store, the compactor and the counters Health reports."""

    def __init__(
        self,
        data_dir,
        store_config: StoreConfig | None = None,
        compaction_config: CompactionConfig | None = None,
        writer: str | None = None,
    ):
        self.data_dir = Path(data_dir).resolve()
        self.store = Store(self.data_dir, store_config, writer)  # recovers the data dir first
        catalog.ensure_catalog(self.data_dir)
        self.compactor = Compactor(self.data_dir, self.store.ledger, compaction_config).start()
        self.liveness = Liveness(self.store)
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self.open_streams = 0
        self.batches_rejected = 0

    def count(self, streams: int = 0, rejected: int = 0) -> None:
        with self._lock:
            self.open_streams += streams
            self.batches_rejected += rejected

    def close(self) -> None:
        self.liveness.stop()
        self.compactor.stop()
        self.store.close()


class _StreamAcks:
    """What one stream's reader thread (and liveness) tell its handler thread."""

    def __init__(self):
        self.cond = threading.Condition()
        self.acked: list[int] = []
        self.requests: list[pb.RankRequest] = []  # for the rank, sent with the next Ack
        self.outstanding = 0  # submitted, not yet durable
        self.reading = True
        self.cancelled = False
        self.error: StreamError | None = None

    def submitted(self) -> None:
        with self.cond:
            self.outstanding += 1

    def withdraw(self) -> None:
        """A submission that did not happen after all."""
        with self.cond:
            self.outstanding -= 1
            self.cond.notify_all()

    def durable(self, seq: int, error: BaseException | None) -> None:
        with self.cond:
            self.outstanding -= 1
            if error is None:
                self.acked.append(seq)
            elif self.error is None:
                self.error = StreamError(
                    grpc.StatusCode.UNAVAILABLE, f"envelope seq {seq} could not be stored ({error}); resend it", seq
                )
            self.cond.notify_all()

    def stop_reading(self, error: StreamError | None = None) -> None:
        with self.cond:
            self.reading = False
            if error is not None and self.error is None:
                self.error = error
            self.cond.notify_all()

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()

    def request(self, request: pb.RankRequest) -> None:
        """Ask the rank something (liveness.RankStream); sent on the next Ack, at once."""
        with self.cond:
            self.requests.append(request)
            self.cond.notify_all()

    def _ended(self) -> bool:
        # A storage error ends the stream without waiting for the client to stop sending.
        return (not self.reading or self.error is not None) and self.outstanding == 0

    def next_acks(self) -> pb.Ack | None:
        """The next Ack (seqs durable now, requests for the rank); an empty Ack once all is
        acked and reading ended (or failed); None if cancelled."""
        with self.cond:
            while not (self.acked or self.requests or self.cancelled or self._ended()):
                self.cond.wait()
            if self.cancelled:
                return None
            acked, self.acked = self.acked, []
            requests, self.requests = self.requests, []
            return pb.Ack(seqs=acked, requests=requests)


class CollectorServicer(pb_grpc.CollectorServicer):
    def __init__(self, state: CollectorState):
        self.state = state

    def Stream(self, request_iterator, context):
        acks = _StreamAcks()
        context.add_callback(acks.cancel)
        self.state.count(streams=1)
        reader = threading.Thread(
            target=self._read, args=(request_iterator, acks), name="rankscope-stream-reader", daemon=True
        )
        reader.start()
        try:
            while (ack := acks.next_acks()) is not None and (ack.seqs or ack.requests):
                yield ack
            if ack is not None and acks.error is not None:
                err = acks.error
                if (
                    err.code in REFUSAL_CODES and err.seq
                ):  # seq 0 names no real envelope  # the client must not resend this one as is
                    context.set_trailing_metadata(((REJECTED_SEQ_KEY, str(err.seq)),))
                context.abort(err.code, err.message)
        finally:
            self.state.count(streams=-1)
            self.state.liveness.closed(acks)

    def _read(self, request_iterator, acks: _StreamAcks) -> None:
        requests = iter(request_iterator)
        received = 0
        while not (acks.cancelled or acks.error is not None):
            try:
                env = next(requests)
            except StopIteration:
                break
            except Exception as exc:  # the client went away mid-stream; what it sent is kept
                log.debug("stream ended: %r", exc)
                break
            received += 1
            if isinstance(env, Undecodable):
                self.state.count(rejected=1)
                acks.stop_reading(
                    StreamError(
                        grpc.StatusCode.INVALID_ARGUMENT, f"message {received} on this stream: {env.problem}", 0
                    )
                )
                return
            try:
                self._accept(env, acks)
            except StreamError as rejected:
                self.state.count(rejected=1)
                log.info("rejected: %s", rejected.message)
                acks.stop_reading(rejected)
                return
            except StoreClosed as exc:
                acks.stop_reading(StreamError(grpc.StatusCode.UNAVAILABLE, str(exc), env.seq))
                return
            except Exception as exc:  # a collector bug, not bad input: say so, keep serving others
                log.exception("envelope seq %d", env.seq)
                acks.stop_reading(
                    StreamError(grpc.StatusCode.INTERNAL, f"envelope seq {env.seq}: collector error {exc!r}", env.seq)
                )
                return
        acks.stop_reading()

    def _accept(self, env: pb.Envelope, acks: _StreamAcks) -> None:
        store = self.state.store
        try:
            check_header(env)
            # A resend of something durable is acked without decoding it again.
            rows = [] if store.is_durable(env.client_id, env.seq) else envelope_rows(env)
        except SchemaVersionError as exc:
            raise StreamError(grpc.StatusCode.FAILED_PRECONDITION, str(exc), env.seq) from None
        except CodecError as exc:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, str(exc), env.seq) from None
        acks.submitted()
        try:
            store.submit(env.client_id, env.seq, rows, partial(acks.durable, env.seq))
        except BaseException:
            acks.withdraw()
            raise
        self.state.liveness.observe(acks, env)  # a resent Hello too: it names the rank's new stream

    def Health(self, request, context):
        if isinstance(request, Undecodable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"health request: {request.problem}")
        s = self.state
        return pb.HealthReply(
            schema_version=SCHEMA_VERSION,
            server_version=SERVER_VERSION,
            uptime_s=time.monotonic() - s.started,
            open_streams=s.open_streams,
            records_durable=s.store.records_durable,
            batches_rejected=s.batches_rejected,
        )


# -- auth ----------------------------------------------------------------------


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        sent = dict(handler_call_details.invocation_metadata).get("authorization", "")
        if hmac.compare_digest(sent.encode() if isinstance(sent, str) else sent, self._expected):
            return handler
        return _refusing_handler(handler)


def _refuse(request_or_iterator, context):
    context.abort(
        grpc.StatusCode.UNAUTHENTICATED,
        "missing or wrong bearer token: send metadata 'authorization: Bearer <token>' (RANKSCOPE_TOKEN)",
    )


def _refusing_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that aborts before reading anything."""
    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kind[(handler.request_streaming, handler.response_streaming)]
    # No request deserializer: an unauthenticated request is never decoded.
    return make(_refuse, request_deserializer=None, response_serializer=handler.response_serializer)


def _add_servicer(servicer: CollectorServicer, server: grpc.Server) -> None:
    """Like pb_grpc.add_CollectorServicer_to_server, with lenient request decoding."""
    handlers = {
        "Stream": grpc.stream_stream_rpc_method_handler(
            servicer.Stream, request_deserializer=_lenient(pb.Envelope), response_serializer=pb.Ack.SerializeToString
        ),
        "Health": grpc.unary_unary_rpc_method_handler(
            servicer.Health,
            request_deserializer=_lenient(pb.HealthRequest),
            response_serializer=pb.HealthReply.SerializeToString,
        ),
    }
    service = pb.DESCRIPTOR.services_by_name["Collector"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))


# -- entry points ----------------------------------------------------------------


def create_server(
    address: str,
    data_dir,
    token: str | None = None,
    *,
    store_config: StoreConfig | None = None,
    compaction_config: CompactionConfig | None = None,
    tls: security.ServerTLS | None = None,
    writer: str | None = None,
    max_workers: int = 512,
) -> tuple[grpc.Server, int, CollectorState]:
    """A collector bound to ``address`` (port 0 picks one), not yet started; with
    ``tls`` it speaks TLS only. The bind policy is serve()'s (security.check_bind).
    ``writer``: this collector's id when several share ``data_dir`` (docs/SCALING.md)."""
    credentials = tls.credentials() if tls is not None else None  # bad files fail before the data dir is taken
    state = CollectorState(data_dir, store_config, compaction_config, writer)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers, thread_name_prefix="rankscope-rpc"),
        interceptors=[BearerTokenInterceptor(token)] if token else [],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
        maximum_concurrent_rpcs=max_workers // 2,
    )
    _add_servicer(CollectorServicer(state), server)
    try:
        if credentials is not None:
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        state.close()
        raise OSError(f"cannot listen on {address}: address in use or invalid")
    return server, port, state


def serve(
    data_dir,
    host: str = "127.0.0.1",
    port: int = 50051,
    token: str | None = None,
    *,
    tls: security.ServerTLS | None = None,
    insecure: bool = False,
    writer: str | None = None,
    flush_interval: float | None = None,
    compaction_interval: float | None = None,
    compaction_min_files: int | None = None,
    metrics_port: int | None = None,
    alert_webhook: str | None = None,
    raw_every: int | None = None,
) -> int:
    """Run a collector until SIGINT/SIGTERM, then commit what is buffered; returns the exit code.

    A non-loopback ``host`` needs a ``token`` or ``insecure=True`` (exit code 2 otherwise);
    the warnings of collector.data.security.check_bind go to stderr. The flush and compaction
    settings default to StoreConfig's and CompactionConfig's; a bad one is exit code 2.
    ``metrics_port``: serve Prometheus /metrics there, on ``host`` (collector.server.metrics);
    ``alert_webhook``: post each new finding to this URL (collector.server.alerts)."""
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        for warning in security.check_bind(host, token=token, tls=tls is not None, insecure=insecure):
            print(f"rankscope collect: {warning}", file=sys.stderr, flush=True)
    except security.SecurityConfigError as exc:
        print(f"rankscope collect: {exc}", file=sys.stderr)
        return 2
    try:
        store_config = StoreConfig(**_given(flush_interval=flush_interval))
        compaction_config = CompactionConfig(
            **_given(interval=compaction_interval, min_files=compaction_min_files, raw_every=raw_every)
        )
        server, bound, state = create_server(
            address,
            data_dir,
            token,
            tls=tls,
            writer=writer,
            store_config=store_config,
            compaction_config=compaction_config,
        )
    except (security.SecurityConfigError, ValueError) as exc:
        print(f"rankscope collect: {exc}", file=sys.stderr)
        return 2
    except (OSError, DataDirBusy) as exc:
        print(f"rankscope collect: {exc}", file=sys.stderr)
        return 1
    metrics = None
    if metrics_port is not None or alert_webhook:
        # imported only when asked for: the findings pull in pandas, the endpoint prometheus_client
        from collector.server.alerts import AlertWebhook
        from collector.server.metrics import MetricsEndpoint

        try:
            webhook = AlertWebhook(alert_webhook) if alert_webhook else None
            metrics = MetricsEndpoint(state, metrics_port, host.strip("[]"), webhook=webhook)
        except (ValueError, RuntimeError, OSError) as exc:
            print(f"rankscope collect: {exc}", file=sys.stderr)
            state.close()
            return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    shown_host = address.rsplit(":", 1)[0]
    scheme = "TLS" if tls is not None else "plaintext"
    auth = "token required" if token else "no token"
    print(
        f"rankscope collector listening on {shown_host}:{bound} ({scheme}, {auth}; data dir {state.data_dir})",
        flush=True,
    )
    if metrics is not None and metrics.port is not None:
        print(f"rankscope collector: Prometheus metrics on http://{shown_host}:{metrics.port}/metrics", flush=True)
    while not stop.wait(1.0):
        pass
    print("rankscope collector: stopping, committing buffered records", flush=True)
    server.stop(grace=5).wait()
    if metrics is not None:
        metrics.close()
    state.close()
    return 0


def _given(**settings):
    """The settings that were given (not None), for a config dataclass to default the rest."""
    return {k: v for k, v in settings.items() if v is not None}
