"""Requests for evidence left in the data dir: how the dashboard (which reads the data dir and
speaks no gRPC) asks a live run's ranks to profile their next steps, send their stacks or report
their memory.

    D/requests/<request_id>.json   {"run_id", "ranks", "kind", "steps", "reference", "who", "asked_at"}

``write`` puts one there atomically (a temporary name, then a rename: a reader never sees half a
file). The collector that owns D polls the folder (collector.server.request_files), sends each
through its command path (collector.server.commands) to the ranks streaming to it, records what
became of it as ``artifacts`` rows (the ranks' own accepted / refused / captured rows; a
``refused`` row from the collector for a rank not streaming there or a request it cannot carry
out) and removes the file. Who may ask: whoever may write D, the same people who may read every
trace in it: the file system's permissions on D are the authentication, as they are for the
data itself (docs/ARCHITECTURE.md).

``read`` checks a file with the same bounds the Command RPC applies, and raises RequestError
naming what is wrong.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import secrets
import socket
import time
from pathlib import Path

from collector.data.codec import CodecError, check_run_id

REQUESTS_DIR = "requests"
KINDS = ("profile", "stacks", "memory")
MAX_STEPS = 20  # collector.server.commands.MAX_PROFILE_STEPS
MAX_RANKS = 64  # collector.server.commands.MAX_RANKS_PER_COMMAND
MAX_FILE_BYTES = 64 << 10
MAX_WHO_CHARS = 200
REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")  # collector.server.artifacts.REQUEST_ID_RE


class RequestError(ValueError):
    """A request file that cannot be carried out, and why."""


def folder(data_dir) -> Path:
    return Path(data_dir) / REQUESTS_DIR


def new_request_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"


def who_asks() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"[:MAX_WHO_CHARS]


def write(
    data_dir, run_id: str, ranks, kind: str = "profile", steps: int = 3, reference: int | None = None, who=None
) -> str:
    """Leave a request in D/requests for the collector; returns its id. RequestError if out of bounds."""
    request = {
        "request_id": new_request_id(kind),
        "run_id": run_id,
        "ranks": [int(r) for r in ranks],
        "kind": kind,
        "steps": int(steps) if kind == "profile" else 0,
        "reference": None if reference is None else int(reference),
        "who": who or who_asks(),
        "asked_at": time.time(),
    }
    check(request)
    target = folder(data_dir) / f"{request['request_id']}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(request))
    os.replace(temp, target)
    return request["request_id"]


def pending(data_dir) -> list[Path]:
    """The request files waiting, oldest first (temporary files left out)."""
    try:
        files = [p for p in folder(data_dir).glob("*.json") if not p.name.startswith(".")]
    except OSError:
        return []
    return sorted(files, key=lambda p: p.name)


def read(path: Path) -> dict:
    """A request file, checked; RequestError naming the file and what is wrong."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise RequestError(f"{path.name}: over {MAX_FILE_BYTES >> 10} KiB")
        request = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"{path.name}: not a readable JSON request ({exc})") from None
    if not isinstance(request, dict):
        raise RequestError(f"{path.name}: not a JSON object")
    try:
        check(request)
    except RequestError as exc:
        raise RequestError(f"{path.name}: {exc}") from None
    if path.stem != request["request_id"]:
        raise RequestError(f"{path.name}: its request_id {request['request_id']!r} is not its file name")
    return request


def check(request: dict) -> None:
    """RequestError naming the first field out of bounds."""
    rid = request.get("request_id")
    if not isinstance(rid, str) or not REQUEST_ID.match(rid):
        raise RequestError(f"request_id {str(rid)[:80]!r} is not 1-64 of [A-Za-z0-9_-]")
    try:
        check_run_id(request.get("run_id"))
    except (CodecError, TypeError) as exc:
        raise RequestError(f"run_id: {exc}") from None
    kind = request.get("kind")
    if kind not in KINDS:
        raise RequestError(f"kind {str(kind)[:40]!r} is not one of {', '.join(KINDS)}")
    ranks = request.get("ranks")
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, int) and r >= 0 for r in ranks):
        raise RequestError("ranks must be a non-empty list of non-negative integers")
    if len(ranks) > MAX_RANKS:
        raise RequestError(f"{len(ranks)} ranks named; at most {MAX_RANKS} per request")
    steps = request.get("steps")
    if kind == "profile" and (not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS):
        raise RequestError(f"steps {steps!r} is outside 1..{MAX_STEPS}")
    reference = request.get("reference")
    if reference is not None and (not isinstance(reference, int) or reference < 0 or reference in ranks):
        raise RequestError(f"reference {reference!r} must be a non-negative rank not among the ranks")
    who = request.get("who", "")
    if not isinstance(who, str) or len(who) > MAX_WHO_CHARS:
        raise RequestError(f"who must be a string of at most {MAX_WHO_CHARS} characters")


def outcome(data_dir, request_id: str, rows) -> str:
    """What became of a request, in one line: each rank's latest answer (``rows``:
    trace_diff.request_rows), or that the file still waits for a collector."""
    if rows.empty:
        if (folder(data_dir) / f"{request_id}.json").exists():
            return f"{request_id}: waiting for the collector (is `rankscope collect` running on this data dir?)"
        return f"{request_id}: sent; waiting for the ranks to answer"
    latest = rows.groupby("rank", sort=True).tail(1).sort_values("rank")
    parts = []
    for r in latest.itertuples():
        said = f"captured steps {r.step}-{r.last_step}" if r.status == "captured" else r.status
        if r.status in ("refused", "failed") and r.detail:
            said += f" ({r.detail})"
        parts.append(f"rank {r.rank} ({r.role}): {said}")
    return f"{request_id}: " + "; ".join(parts)
