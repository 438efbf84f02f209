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

A count costs a file nothing to claim, so the counts of one file together may claim at
most ``MAX_CLAIMED_ROWS`` rows (checked before any row is made; a file over it is skipped
whole, naming the entry that crossed it), and the rows of one entry share one dict.
"""

from __future__ import annotations

import re
from pathlib import Path

from collector.tools.importers import base, torch_profiler
from collector.tools.importers.base import FileTooCostly, Parsed, load_json
from collector.tools.importers.comms import comm_row

NAME = "comms_summary"
MAX_BYTES = base.MAX_JSON_BYTES
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
    """A .json holding a summary; also one too large or too deeply nested to look inside
    (parse then reports it by name rather than the import leaving it out unsaid)."""
    if path.suffix != ".json" or torch_profiler.detect(path):  # a trace is no summary, however large
        return False
    try:
        return _shape(load_json(path, MAX_BYTES)) is not None
    except FileTooCostly:
        return True
    except (OSError, ValueError):
        return False


def parse(path: Path, world_size: int | None = None) -> Parsed:
    out = Parsed(sources=[str(path)])
    try:
        doc = load_json(path, MAX_BYTES)
    except OSError as exc:
        return out.unreadable(path, exc)
    except FileTooCostly as exc:
        return out.refuse("", f"{exc}; file skipped")
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
    entries, claimed = [], 0
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
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                out.problem(path, where, f"bad entry ({exc!r}); skipped")
                continue
            if count < 0:
                out.problem(path, where, f"bad entry (count {count} is negative); skipped")
                continue
            claimed += count
            if claimed > base.MAX_CLAIMED_ROWS:
                return out.refuse(
                    f"{where}.count",
                    f"claims {count:,} collectives"
                    + (f", {claimed:,} with the entries before it" if claimed != count else "")
                    + f": one summary file may expand to at most {base.MAX_CLAIMED_ROWS:,} rows; file skipped",
                )
            entries.append((record_name, size, count, latency_ms, where))
    for record_name, size, count, latency_ms, where in entries:
        row = comm_row(record_name, size, latency_ms, world, deepspeed_sizes=shape == "deepspeed")
        out.add_repeated("comm", rank, where, count, row)
    return out
