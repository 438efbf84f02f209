"""Where the collector keeps what ranks captured when asked (``pb.Artifact``: a profiler trace,
a memory report), and the ``artifacts`` row that says so.

    D/artifacts/run=<run_id>/<request_id>-rank<rank>-<kind>.json.gz

The file is written (temporary name, then renamed) on the intake thread that handles the
envelope, before its row is submitted to the store; a resent envelope writes the same file
again under the same name, so a collector restart mid-upload leaves one file, not two. Bad input
(an unsafe request id, an unknown kind, bytes that are not gzip, over the bound) is a CodecError,
which refuses the envelope like any other malformed one.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pyarrow as pa

from collector.data.codec import CodecError, Rows, check_run_id
from collector.data.schema import TABLES
from proto import pb

ARTIFACTS_DIR = "artifacts"
KINDS = ("profile", "memory")
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
MAX_ARTIFACT_BYTES = 48 << 20  # compressed; a rank bounds its traces at 32 MiB (collector.rank.capture)
MAX_TEXT_CHARS = 2000  # reason, finding


def relative_path(artifact: pb.Artifact) -> str:
    return f"{ARTIFACTS_DIR}/run={artifact.run_id}/{artifact.request_id}-rank{artifact.rank}-{artifact.kind}.json.gz"


def check(artifact: pb.Artifact, seq: int) -> None:
    """CodecError naming what is wrong with an artifact envelope."""
    where = f"envelope seq {seq}: artifact"
    try:
        check_run_id(artifact.run_id)
    except CodecError as exc:
        raise CodecError(f"{where}: {exc}") from None
    if artifact.rank < 0:
        raise CodecError(f"{where}: rank {artifact.rank} is negative")
    if not REQUEST_ID_RE.match(artifact.request_id):
        raise CodecError(f"{where}: request_id {artifact.request_id[:80]!r} is not 1-64 of [A-Za-z0-9_-]")
    if artifact.kind not in KINDS:
        raise CodecError(f"{where}: kind {artifact.kind[:40]!r} is not one of {', '.join(KINDS)}")
    if len(artifact.data) > MAX_ARTIFACT_BYTES:
        raise CodecError(f"{where}: {len(artifact.data)} bytes, over the {MAX_ARTIFACT_BYTES >> 20} MiB bound")
    if artifact.data[:2] != b"\x1f\x8b":
        raise CodecError(f"{where}: data is not gzip")
    for name in ("reason", "finding", "role"):
        if len(getattr(artifact, name)) > MAX_TEXT_CHARS:
            raise CodecError(f"{where}: {name} is over {MAX_TEXT_CHARS} characters")


def stored_rows(data_dir: Path, env: pb.Envelope) -> list[Rows]:
    """Write the artifact's file under ``data_dir`` and return its ``artifacts`` row for the store."""
    artifact = env.artifact
    check(artifact, env.seq)
    path = relative_path(artifact)
    target = Path(data_dir) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temp.write_bytes(artifact.data)
    os.replace(temp, target)
    row = {
        "rank": artifact.rank,
        "step": artifact.first_step,
        "request_id": artifact.request_id,
        "kind": artifact.kind,
        "status": "captured",
        "steps": artifact.last_step - artifact.first_step + 1,
        "last_step": artifact.last_step,
        "path": path,
        "bytes": len(artifact.data),
        "reason": artifact.reason,
        "finding": artifact.finding,
        "role": artifact.role,
        "detail": "",
        "time_ns": time.time_ns(),
    }
    schema = TABLES["artifacts"].arrow_schema()
    table = pa.table({name: pa.array([row[name]], schema.field(name).type) for name in schema.names}, schema=schema)
    return [("artifacts", artifact.run_id, table)]
