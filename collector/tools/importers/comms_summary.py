"""``deepspeed.comm.log_summary(return_dict=True)`` saved as JSON, one file per rank.

DeepSpeed 0.19 returns ``{"summary": {record_name: {msg_size: stats}},
"straggler_analysis": ..., "metadata": {"world_size", "rank", "timestamp"}}``
where stats has ``count``, ``total_latency_ms``, ``avg_latency_ms`` (10%-trimmed
mean), ``tput_avg_gbps``, ``busbw_avg_gbps``, ``msg_size_bytes``; JSON turns the
msg_size keys into strings. rankscope's own ``comm.log_summary(return_dict=True)``
returns the bare ``{record_name: {msg_size: stats}}`` with sizes that already are
nccl-tests S; that shape is read too (rank from ``--rank``/the file name, else 0).

How a summary is stored: a summary has no per-instance timings, so each
(record, size) entry becomes ``count`` rows of ``comm`` -- one per instance the
logger counted -- with ``start_ns``/``end_ns``/``seq`` NULL and the bandwidths
computed from the entry's average latency. So ``count(*)`` and ``sum(bytes)``
per op are exact, ``avg(algbw_gbs)`` is the summary's average, and the rows are
never mistaken for timed instances (every timeline and the straggler views need
``start_ns``). ``log_name`` carries the record name as DeepSpeed printed it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from collector.tools.importers.base import Parsed
from collector.tools.importers.comms import comm_row

NAME = "comms_summary"
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def _looks_like_entries(sizes) -> bool:
    return isinstance(sizes, dict) and all(isinstance(v, dict) and "count" in v for v in sizes.values())


def _shape(doc) -> str | None:
    if isinstance(doc, dict) and isinstance(doc.get("summary"), dict) and "metadata" in doc:
        return "deepspeed"
    if isinstance(doc, dict) and doc and all(_looks_like_entries(v) for v in doc.values()):
        return "rankscope"
    return None


def detect(path: Path) -> bool:
    if path.suffix != ".json" or path.stat().st_size > 256 << 20:
        return False
    try:
        return _shape(json.loads(path.read_text(errors="replace"))) is not None
    except (OSError, ValueError):
        return False


def parse(path: Path, world_size: int | None = None) -> Parsed:
    out = Parsed(sources=[str(path)])
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        return out.unreadable(path, exc)
    except ValueError as exc:
        where = f"line {exc.lineno}" if hasattr(exc, "lineno") else ""
        out.problem(path, where, f"not valid JSON: {exc.msg if hasattr(exc, 'msg') else exc}")
        return out
    shape = _shape(doc)
    if shape is None:
        out.problem(path, "", "not a log_summary(return_dict=True) dict")
        return out
    if shape == "deepspeed":
        meta = doc.get("metadata") or {}
        rank = int(meta.get("rank", 0))
        world = int(meta.get("world_size") or world_size or 1)
        summary = doc["summary"]
    else:
        m = _RANK_IN_NAME.search(path.stem)
        rank = int(m.group(1)) if m else 0
        world = world_size or rank + 1
        summary = doc
    out.world_size = world
    for record_name, sizes in summary.items():
        if not isinstance(sizes, dict):
            out.problem(path, f"summary[{record_name!r}]", "expected {msg_size: stats}; skipped")
            continue
        for size_key, stats in sizes.items():
            where = f"summary[{record_name!r}][{size_key!r}]"
            try:
                size = int(stats.get("msg_size_bytes", size_key))
                count = int(stats["count"])
                latency_ms = float(stats["avg_latency_ms"])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                out.problem(path, where, f"bad entry ({exc!r}); skipped")
                continue
            row = comm_row(record_name, size, latency_ms, world, deepspeed_sizes=shape == "deepspeed")
            for _ in range(count):
                out.add("comm", rank, where, **row)
    return out
