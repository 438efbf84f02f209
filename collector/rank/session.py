"""The rank-side telemetry session: run identity, the record buffer and the
client that ships it. Everything that produces records (the comm recorder, the
engine, profiler, monitor) goes through the module functions here, which are
no-ops without a session, never raise and never block.

Producers that keep records of their own before emitting them (the comm
recorder) ``register`` a ``Producer``: the session tells them when a session
starts or ends and when the process forks, asks them to flush at ``stop`` and
adds their dropped count to the rank's RunEnd. The session imports no producer.

Run identity. All ranks of one job share one ``run_id``: rank 0 makes it (run
name + UTC timestamp + random suffix, only [A-Za-z0-9_.-]) and broadcasts it
over torch.distributed, so a second job with the same name gets a new id. The
exchange is collective, so it runs when a process group exists: at ``start``
if one is initialised, else right after ``init_process_group`` (collector.hook
wraps it; collector.rank.ops.init_process_group calls ``on_process_group``). A
process that never gets a process group (``WORLD_SIZE`` unset or 1) is the
single-rank case and resolves its identity at once. The same exchange
estimates this rank's clock offset to rank 0 (collector.clock).

Name of the run (``runs.name``): ``start(run=...)``, else ``RANKSCOPE_RUN``,
else the config's ``telemetry.run``, else the script's name. Endpoint, token and
TLS CA resolve the same way (argument, ``RANKSCOPE_ENDPOINT`` / ``RANKSCOPE_TOKEN`` /
``RANKSCOPE_TLS_CA``, ``telemetry.endpoint`` / ``telemetry.token`` / ``telemetry.tls_ca``,
default 127.0.0.1:50051 in plaintext).

Liveness settings (collector.rank.watchdog): ``hang_after_s``, how long a collective
may stay in flight before the rank reports a hang and captures its stacks
(``start(hang_after_s=...)``, else ``RANKSCOPE_HANG_AFTER_S``, else
``telemetry.hang_after_s``, default 60 s), and ``heartbeat_s``, the heartbeat period
(``RANKSCOPE_HEARTBEAT_S``, else ``telemetry.heartbeat_s``, default 1 s).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from collector.data import hang_rule
from collector.data.config import ConfigBlock, ConfigError, setting
from collector.data.layout import new_run_id
from collector.rank import state
from collector.rank.client import MAX_SPOOL_BYTES, MAX_UNACKED_BYTES
from collector.rank.clock import CLOCK
from collector.rank.records import RecordBuffer

log = logging.getLogger("rankscope.telemetry")

DEFAULT_ENDPOINT = "127.0.0.1:50051"
# stop() waits this long at most for async ops still in flight; those it gives up on count as dropped
STOP_WAIT_S = 1.0

_session: Session | None = None
_lock = threading.RLock()
_failed = False  # set by the excepthook: the run ends as "failed"
_stopped = False  # Ctrl-C, or a stop signal noted by ``note_stopped``: the run ends as "stopped"


def note_stopped() -> None:
    """This process was asked to stop (SIGINT, SIGTERM, SIGHUP from its user or its supervisor):
    its run ends "stopped", not "failed", whatever it raises on the way out (a collective whose
    peer stopped first fails). collector.tools.supervise calls it from its signal handlers."""
    global _stopped
    _stopped = True


def _end_status() -> str:
    return "stopped" if _stopped else "failed" if _failed else "finished"


@dataclass(kw_only=True)
class TelemetryConfig(ConfigBlock):
    """The ``telemetry`` section of the training config."""

    SECTION: ClassVar[str] = "telemetry"
    enabled: bool = True
    run: str | None = None
    endpoint: str | None = None
    token: str | None = None
    tls_ca: str | None = None
    spool_dir: str | None = None
    hang_after_s: float = setting(hang_rule.DEFAULT_HANG_AFTER_S, gt=0)
    heartbeat_s: float = setting(1.0, gt=0, le=60)
    max_unacked_bytes: int = setting(MAX_UNACKED_BYTES, ge=1)  # un-acked records in memory (collector.rank.client)
    max_spool_bytes: int = setting(MAX_SPOOL_BYTES, ge=1)  # this process's spool files; beyond, the oldest go

    def validate(self) -> None:
        for key in ("run", "endpoint", "token", "tls_ca", "spool_dir"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                self.fail(key, "must be a non-empty string", value)


@dataclass(frozen=True)
class Producer:
    """A part that keeps records before emitting them, and what the session may ask of it."""

    name: str
    flush: Callable[[float], object] | None = None  # flush(wait_s): emit what it holds, waiting up to wait_s
    dropped: Callable[[], int] | None = None  # records it lost so far
    on_change: Callable[[bool], None] | None = None  # a session started (True) or ended (False)
    on_fork: Callable[[], None] | None = None  # in a forked child, which inherits no session


_producers: list[Producer] = []


def register(producer: Producer) -> None:
    """Add a producer; it is told at once whether a session is active."""
    _producers.append(producer)
    if producer.on_change is not None:
        producer.on_change(_session is not None)


def _notify(active: bool) -> None:
    for p in _producers:
        if p.on_change is not None:
            try:
                p.on_change(active)
            except Exception:
                log.exception("rankscope: producer %s failed on a session change", p.name)


def _training_config(config) -> dict:
    if config is None:
        return {}
    if isinstance(config, (str, Path)):
        try:
            with open(config) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"config file {config}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict or a JSON file path, got {type(config).__name__}")
    return config


SECRET_KEYS = ("token", "password", "secret", "api_key")


def redacted(config):
    """The config as the collector stores it (``runs.config``): secrets replaced, so a bearer
    token in ``telemetry.token`` (or a wandb key) is not readable by everyone who can query."""
    if isinstance(config, dict):
        return {
            k: "<redacted>" if isinstance(k, str) and any(s in k.lower() for s in SECRET_KEYS) and v else redacted(v)
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [redacted(v) for v in config]
    return config


def _script_name() -> str:
    arg0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return Path(arg0).stem or "python"


class Session:
    def __init__(
        self,
        *,
        run_name: str,
        endpoint: str,
        token: str | None,
        spool_dir: str | None,
        config: dict,
        source: str,
        tls_ca: str | None = None,
        hang_after_s: float = hang_rule.DEFAULT_HANG_AFTER_S,
        heartbeat_s: float = 1.0,
        limits: dict | None = None,
    ) -> None:
        from collector.rank.client import Client, ClientConfig

        self.run_name = run_name
        self.source = source
        self.hang_after_s, self.heartbeat_s = hang_after_s, heartbeat_s
        self.config_json = json.dumps(redacted(config), default=str) if config else ""
        self.run_id: str | None = None
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.started_at_ns = time.time_ns()
        host = socket.gethostname()
        self.host = host
        self.client_id = re.sub(r"[^A-Za-z0-9_.]", "_", f"{host}.{os.getpid()}.{secrets.token_hex(4)}")
        self.buffer = RecordBuffer()
        self.client_config = ClientConfig(
            endpoint=endpoint, token=token, tls_ca=tls_ca, spool_dir=spool_dir, **(limits or {})
        )
        self.client = Client(self.client_config, self.client_id, self.buffer)

    @property
    def ready(self) -> bool:
        return self.run_id is not None

    def resolve_identity(self, collective: bool) -> None:
        """Agree on run_id and measure the clock offset (collective when a process group exists)."""
        from proto import pb

        offset = 0
        if collective:
            import torch.distributed.distributed_c10d as c10d

            from collector.rank.clock import estimate_offsets

            self.rank, self.world_size = c10d.get_rank(), c10d.get_world_size()
            box = [new_run_id(self.run_name) if self.rank == 0 else None]
            if self.world_size > 1:
                c10d.broadcast_object_list(box, src=0)
                offset = estimate_offsets()
            self.run_id = box[0]
        else:
            self.run_id = new_run_id(self.run_name)
        CLOCK.offset_ns = offset
        self.client.start(
            pb.Hello(
                run_id=self.run_id,
                run_name=self.run_name,
                rank=self.rank,
                world_size=self.world_size,
                host=self.host,
                pid=os.getpid(),
                config_json=self.config_json,
                started_at_ns=self.started_at_ns,
                clock_offset_ns=offset,
                source=self.source,
            )
        )


def start(
    run=None,
    endpoint=None,
    token=None,
    config=None,
    source="hook",
    tls_ca=None,
    telemetry: TelemetryConfig | None = None,
    hang_after_s: float | None = None,
) -> Session | None:
    """Start (or return) this process's session. Idempotent. Raises ValueError
    only for a bad config; returns None when the config disables telemetry.
    ``telemetry``: the config's telemetry block when the caller has built it already
    (the engine has; reading it again would report its unknown keys twice)."""
    global _session
    with _lock:
        if _session is not None:
            return _session
        train_cfg = _training_config(config)
        cfg = TelemetryConfig.from_dict(telemetry if telemetry is not None else train_cfg.get("telemetry"))
        if not cfg.enabled:
            return None
        name = run or os.environ.get("RANKSCOPE_RUN") or cfg.run or _script_name()
        hang_after = _seconds("hang_after_s", hang_after_s, "RANKSCOPE_HANG_AFTER_S", cfg.hang_after_s)
        heartbeat = _seconds("heartbeat_s", None, "RANKSCOPE_HEARTBEAT_S", cfg.heartbeat_s)
        session = Session(
            run_name=name,
            endpoint=endpoint or os.environ.get("RANKSCOPE_ENDPOINT") or cfg.endpoint or DEFAULT_ENDPOINT,
            token=token or os.environ.get("RANKSCOPE_TOKEN") or cfg.token,
            tls_ca=tls_ca or os.environ.get("RANKSCOPE_TLS_CA") or cfg.tls_ca,
            spool_dir=cfg.spool_dir,
            config=train_cfg,
            source=source,
            hang_after_s=hang_after,
            heartbeat_s=heartbeat,
            limits={"max_unacked_bytes": cfg.max_unacked_bytes, "max_spool_bytes": cfg.max_spool_bytes},
        )
        _session = session
        _install_exit_hooks()
        try:
            _resolve_if_possible(session)
        except Exception:
            log.exception("rankscope: could not agree on the run identity; telemetry is off for this rank")
            _session = None
            return None
        _notify(True)
        return session


def _seconds(key: str, given: float | None, env: str, configured: float) -> float:
    """A duration setting: the argument, else the environment variable, else the config."""
    if given is None:
        raw = os.environ.get(env)
        if not raw:
            return configured
        try:
            given = float(raw)
        except ValueError:
            raise ConfigError(f"{env}: must be a number of seconds (got {raw!r})") from None
        where = env
    else:
        where = key
    if not given > 0 or given != given or given == float("inf"):
        raise ConfigError(f"{where}: must be a positive number of seconds (got {given!r})")
    return float(given)


def _resolve_if_possible(session: Session) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        session.resolve_identity(collective=True)
    elif int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        session.resolve_identity(collective=False)
    # else: a multi-rank job before init_process_group: on_process_group() finishes it


def on_process_group() -> None:
    """init_process_group just returned: finish a session waiting for it."""
    s = _session
    if s is not None and not s.ready:
        try:
            s.resolve_identity(collective=True)
        except Exception:
            log.exception("rankscope: run identity exchange failed; this rank's records are not shipped")


def active() -> Session | None:
    """This process's session, or None."""
    return _session


def stop(status: str = "finished") -> None:
    """Flush everything, send RunEnd, wait (bounded) for acks, spool the rest."""
    global _session
    from proto import pb

    with _lock:
        s = _session
        if s is None:
            return
        produced_dropped = 0
        for p in _producers:  # the run's last async ops may still be in flight
            try:
                if p.flush is not None:
                    p.flush(STOP_WAIT_S)
                if p.dropped is not None:
                    produced_dropped += p.dropped()
            except Exception:
                log.exception("rankscope: producer %s failed to flush", p.name)
        _session = None
        _notify(False)
        try:
            if not s.ready:
                s.resolve_identity(collective=False)  # never got a process group
            s.client.close(
                pb.RunEnd(
                    run_id=s.run_id,
                    rank=s.rank,
                    status=status,
                    ended_at_ns=CLOCK.now_ns(),
                    dropped_records=produced_dropped,
                )
            )
            dropped = s.buffer.dropped + s.client.dropped_rejected + produced_dropped
            if dropped:
                log.warning(
                    "rankscope: %d record(s) were dropped on rank %d (buffer full or rejected)", dropped, s.rank
                )
        except Exception:
            log.exception("rankscope: error while stopping telemetry")


set_step = state.set_step
get_step = state.get_step


def emit(table: str, **row) -> None:
    """One record of ``table`` (schema.TABLES); ``step`` defaults to the current step."""
    s = _session
    if s is None:
        return
    try:
        if s.buffer.add_row(table, row, state.step) and len(s.buffer) >= s.client_config.batch_rows:
            s.client.poke()
    except Exception:
        pass


def emit_rows(table: str, rows) -> None:
    s = _session
    if s is None:
        return
    for row in rows:
        try:
            s.buffer.add_row(table, dict(row), state.step)
        except Exception:
            pass
    if len(s.buffer) >= s.client_config.batch_rows:
        s.client.poke()


def emit_columns(table: str, columns: dict[str, list], rows: int) -> None:
    """A chunk of ``rows`` rows as column lists (the comm drain thread's fast path)."""
    s = _session
    if s is None:
        return
    try:
        if s.buffer.add_columns(table, columns, rows) and len(s.buffer) >= s.client_config.batch_rows:
            s.client.poke()
    except Exception:
        pass


_hooks_installed = False


def _install_exit_hooks() -> None:
    """Flush at interpreter exit; a run that dies of an uncaught exception ends "failed", of Ctrl-C
    (KeyboardInterrupt) "stopped"; a forked child (DataLoader worker) does not inherit the parent's
    session."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(lambda: stop(_end_status()))
    previous = sys.excepthook

    def excepthook(*exc_info):
        global _failed, _stopped
        if issubclass(exc_info[0], KeyboardInterrupt):
            _stopped = True
        else:
            _failed = True
        previous(*exc_info)

    sys.excepthook = excepthook

    def forget_in_child():
        global _session
        _session = None
        for p in _producers:
            if p.on_fork is not None:
                p.on_fork()

    os.register_at_fork(after_in_child=forget_in_child)
