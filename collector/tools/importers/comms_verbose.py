"""The comms logger's verbose console lines (``"comms_logger": {"verbose": true}``).

DeepSpeed 0.19 (deepspeed/utils/comms_logging.py, through log_dist on rank 0)::

    [2026-11-22 05:16:21,229] [INFO] [logging.py:123:log_dist] [Rank 0] comm op: broadcast | time (ms): 1.77 \
        | msg size: 4.0 KB | algbw (Gbps): 0.02 | busbw (Gbps): 0.02        (one line in the log)

Older releases wrote ``[Rank 0] rank=0 | comm op: ...``, and rankscope's own
logger writes ``[rankscope] [Rank 0] rank=0 | comm op: ...`` (no time stamp,
sizes already nccl-tests S); all three are read. Each line is one collective
instance: ``end_ns`` is the log time stamp (local time, millisecond resolution,
read in this machine's time zone) and ``start_ns`` = end - latency; lines
without a time stamp have neither. ``seq`` is unknown (DeepSpeed does not log
the group), so these rows do not join across ranks in ``comm_instances``.

A console log holds much else: only lines with "comm op:" are comm records,
and such a line that does not parse is reported. The world size, which S
needs for gather-like ops, comes from the caller (a summary JSON or flops
profile beside the log, or ``--world-size``), else from the "world_size = N"
DeepSpeed prints at start-up, else the ranks seen.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from collector.tools.importers.base import Parsed, parse_size
from collector.tools.importers.comms import comm_row

NAME = "comms_verbose"
_LINE = re.compile(
    r"^(?:\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\][^\n]*?)?"
    r"(?P<ours>\[rankscope\] )?\[Rank (?P<rank>-?\d+)\] (?:rank=\d+ \| )?"
    r"comm op: (?P<name>.+?) \| time \(ms\): (?P<ms>[0-9.]+) \| msg size: (?P<size>[^|]+?) \| "
    r"algbw \(Gbps\): [0-9.]+\s*\| busbw \(Gbps\): [0-9.]+\s*$"
)
_WORLD = re.compile(r"world_size = (\d+)")
_SNIFF_BYTES = 1 << 20


def detect(path: Path) -> bool:
    if path.suffix not in (".log", ".txt", ".out", ".err") or "tfevents" in path.name:
        return False
    try:
        with open(path, errors="replace") as f:
            return "comm op: " in f.read(_SNIFF_BYTES)
    except OSError:
        return False


def _timestamp_ns(text: str) -> int:
    t = datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f")  # naive: this machine's local time
    return int(t.replace(microsecond=0).timestamp()) * 1_000_000_000 + t.microsecond * 1000


def parse(path: Path, world_size: int | None = None) -> Parsed:
    out = Parsed(sources=[str(path)])
    try:
        f = open(path, errors="replace")
    except OSError as exc:
        return out.unreadable(path, exc)
    matches = []
    logged_world = None
    with f:
        for number, line in enumerate(f, 1):
            if "comm op: " not in line:
                if logged_world is None and (w := _WORLD.search(line)):
                    logged_world = int(w.group(1))
                continue
            m = _LINE.search(line.rstrip("\n"))
            if m is None:
                out.problem(path, f"line {number}", "a 'comm op:' line in an unknown format; skipped")
                continue
            try:
                size = parse_size(m.group("size"))
                end_ns = _timestamp_ns(m.group("ts")) if m.group("ts") else None
            except ValueError as exc:
                out.problem(path, f"line {number}", f"{exc}; skipped")
                continue
            matches.append((m, size, end_ns))
    ranks = {int(m.group("rank")) for m, _, _ in matches}
    world = world_size or logged_world or (max(ranks) + 1 if ranks else 1)
    out.world_size = world
    for m, size, end_ns in matches:
        rank = max(int(m.group("rank")), 0)
        out.add(
            "comm",
            rank,
            **comm_row(
                m.group("name"), size, float(m.group("ms")), world, deepspeed_sizes=not m.group("ours"), end_ns=end_ns
            ),
        )
    return out
