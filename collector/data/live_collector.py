"""Where the collector serving a data dir listens: ``D/collector.json``.

A running collector (collector/server/serve.py) writes this file when it listens and removes it
when it stops cleanly; the commands that talk to a collector (``profile``, ``stacks``, ``replay``,
``health``) read it from their ``--data-dir`` when no ``--endpoint`` is given, so the demo's
collector on a free port is found with no flag. The file is small JSON::

    {"endpoint": "127.0.0.1:40123", "token_required": false, "tls": false, "pid": 4242,
     "started": <the process's start time in clock ticks since boot, Linux; null elsewhere>}

Written atomically (a temporary name, then a rename: a reader never sees half of it), mode 0600.
A collector killed with SIGKILL leaves its file behind: ``read`` returns None when the pid is gone,
or when the pid now belongs to another process (its start time differs), so a stale file never
sends a command to a port nobody, or somebody else, listens on. The token itself is never written.

``fetch`` asks that collector (its Health RPC) for the findings it holds in memory of a run it
follows live (collector.server.live_findings): what ``rankscope health`` prints first
(collector.tools.live_health) and the dashboard's attention banner shows, so both agree with
/metrics and the alerts. It imports grpc and the stubs, never pandas or duckdb.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from collector.data import processes

FILE_NAME = "collector.json"
TIMEOUT_S = 3.0  # a busy collector (its findings refresh holds the GIL for a moment) still beats the data dir


@dataclass(frozen=True)
class LiveCollector:
    """A collector that is serving a data dir now."""

    endpoint: str  # host:port a client on this machine dials (a wildcard bind reads as loopback)
    token_required: bool
    pid: int
    tls: bool = False


def path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / FILE_NAME


def dialable(host: str, port: int) -> str:
    """``host:port`` a local client can dial: a wildcard bind (0.0.0.0, [::]) reads as loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host in ("[::]", "::"):
        host = "[::1]"
    return f"{host}:{port}"


def write(data_dir: str | os.PathLike, endpoint: str, token_required: bool, pid: int, *, tls: bool = False) -> Path:
    """Advertise ``endpoint`` as the collector of ``data_dir`` (atomic, mode 0600)."""
    target = path(data_dir)
    temp = target.with_name(f".{FILE_NAME}.{pid}.tmp")
    body = {
        "endpoint": endpoint,
        "token_required": bool(token_required),
        "tls": bool(tls),
        "pid": int(pid),
        "started": processes.start_time(pid),
    }
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return target


def remove(data_dir: str | os.PathLike, pid: int, endpoint: str | None = None) -> None:
    """Withdraw the advertisement, if it is still this collector's (``pid``, and ``endpoint`` when
    given): another collector sharing the data dir may have advertised itself since."""
    target = path(data_dir)
    try:
        body = json.loads(target.read_text(encoding="utf-8"))
        if body.get("pid") == pid and endpoint in (None, body.get("endpoint")):
            target.unlink(missing_ok=True)
    except (OSError, ValueError, AttributeError):
        pass


def read(data_dir: str | os.PathLike) -> LiveCollector | None:
    """The collector serving ``data_dir`` now; None when none advertises, or its process is gone."""
    try:
        body = json.loads(path(data_dir).read_text(encoding="utf-8"))
        pid = int(body["pid"])
        live = LiveCollector(
            endpoint=str(body["endpoint"]),
            token_required=bool(body.get("token_required", False)),
            pid=pid,
            tls=bool(body.get("tls", False)),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not processes.alive(pid):
        return None
    started = body.get("started")
    if started is not None and processes.start_time(pid) not in (None, started):
        return None  # the pid was reused by another process
    return live


class Answer(NamedTuple):
    """A live collector's findings of a run it follows."""

    run_id: str
    findings: list[dict]  # as Finding.to_json gives them, most urgent first
    age_s: float  # since the collector computed the stored-data part (the live part is current)
    evidence: list[dict]  # the run's captured profile diffs (collector.data.trace_diff.evidence)


def fetch(data_dir, run: str, *, timeout_s: float = TIMEOUT_S) -> Answer | None:
    """The live collector of ``data_dir``'s answer for ``run`` (an id or a name); None when none
    advertises, it needs a token or TLS CA not given (``RANKSCOPE_TOKEN``, ``RANKSCOPE_TLS_CA``), does
    not answer within ``timeout_s``, or does not follow the run live."""
    from collector.data import security

    live = read(data_dir)
    if live is None:
        return None
    token = security.resolve_token()
    if live.token_required and not token:
        return None
    tls_ca = security.resolve_tls_ca()
    if live.tls and not tls_ca:
        return None
    import grpc

    from proto import pb, pb_grpc

    try:
        with security.open_channel(live.endpoint, tls_ca=tls_ca if live.tls else None) as channel:
            reply = pb_grpc.CollectorStub(channel).Health(
                pb.HealthRequest(run=run), timeout=timeout_s, metadata=security.auth_metadata(token)
            )
    except (grpc.RpcError, security.SecurityConfigError):
        return None
    if not reply.held:
        return None
    return Answer(
        reply.run_id,
        json.loads(reply.findings_json or "[]"),
        reply.findings_age_s,
        json.loads(reply.evidence_json or "[]"),
    )
