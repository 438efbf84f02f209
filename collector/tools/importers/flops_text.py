"""The flops profiler's text report (``"flops_profiler": {"output_file": ...}``, or stdout).

DeepSpeed (deepspeed/profiling/flops_profiler/profiler.py, print_model_profile)
prints a summary (``Profile Summary at step N``, ``world size``, ``params per
GPU``, ``fwd MACs per GPU``, ``fwd flops per GPU``, ``fwd latency``, ``bwd
latency``, ...) and then the model's repr with each module's profile::

    Sequential(
      1.35 K = 100% Params, 5.12 KMACs = 100% MACs, 1.8 Gs = 100% latency, 0 FLOPS
      (0): Linear(1.09 K = 80.71% Params, 4.1 KMACs = 80% MACs, 98.71 us = 0% latency, 82.99 MFLOPS, ...)
      (1): ReLU(0 = 0% Params, 0 MACs = 0% MACs, 30.28 us = 0% latency, 8.45 MFLOPS)
    )

(older releases: ``1.05 M, 0.31% Params, 10.74 GMACs, ...``; both are read).
Each module becomes a ``flops`` row: ``module`` is the dotted path ('' for the
root), ``parent``, ``depth``, ``module_type``, and the printed ``params``,
``macs``, ``latency_ns``. The report prints no per-module flops, only the FLOPS
rate, so a module's ``flops`` is rate x latency (NULL when the latency is 0);
the root's ``flops`` and ``bwd_latency_ns`` are the summary's ``fwd flops per
GPU`` and ``bwd latency``. The report rounds to 3 significant digits, so every
number is within 0.5% of the profiler's. Modules printed as ``Name(...)``
(beyond module_depth) get a row with NULL figures. The profile is rank 0's.
"""

from __future__ import annotations

import re
from pathlib import Path

from collector.tools.importers.base import Parsed, parse_metric

NAME = "flops_text"
_BANNER = "-- DeepSpeed Flops Profiler --"
_STEP = re.compile(r"Profile Summary at step (\d+)")
_SUMMARY = re.compile(r"^(?P<key>[A-Za-z][^:=]*?(?:=[^:]*)?):\s+(?P<value>\S.*?)\s*$")
_ROOT = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)\((?P<rest>.*)$")
_CHILD = re.compile(r"^(?P<indent>\s+)\((?P<name>[^()]+)\): (?P<type>[A-Za-z_][\w.]*)\((?P<rest>.*)$")
# A figure as DeepSpeed's number_to_string writes it: f"{round(x / magnitude, 2):g} {prefix}", so any
# of T G M K m u (params: B for G), a sign, and :g's exponent for |x| >= 1e6 of the largest prefix.
# The root's latency is often ~1.8 Gs (an epoch time, not a duration) and its rate then mFLOPS.
_NUM = r"-?[0-9.]+(?:e[+-]?[0-9]+)?"
_PREFIX = "[TGMKmu]?"
_PCT = rf"(?:{_NUM}|nan|inf)%"
_STATS = re.compile(
    rf"^\s*(?P<params>{_NUM}(?: ?[TBMKmu])?)\s?[=,] {_PCT} Params, "
    rf"(?P<macs>{_NUM} ?{_PREFIX}MACs)\s?[=,] {_PCT} MACs, "
    rf"(?P<lat>{_NUM} ?{_PREFIX}s)\s?[=,] {_PCT} latency, "
    rf"(?P<rate>{_NUM} ?{_PREFIX}FLOPS)"
)


def detect(path: Path) -> bool:
    if "tfevents" in path.name or path.suffix in (".csv", ".json", ".parquet"):
        return False
    try:
        with open(path, errors="replace") as f:
            return _BANNER in f.read(1 << 16)
    except OSError:
        return False


def _number(text: str, unit: str) -> float:
    return parse_metric(text.replace("B", "G") if unit == "" else text, unit)


def _figures(stats: re.Match) -> dict:
    latency_s = _number(stats.group("lat"), "s")
    rate = _number(stats.group("rate"), "FLOPS")
    return dict(
        params=round(_number(stats.group("params"), "")),
        macs=round(_number(stats.group("macs"), "MACs")),
        latency_ns=round(latency_s * 1e9),
        flops=round(rate * latency_s) if latency_s > 0 else None,
    )


class _Profile:
    """One printed profile: the summary figures and the module rows in print order."""

    def __init__(self, step: int | None):
        self.step = step
        self.summary: dict[str, str] = {}
        self.modules: list[dict] = []
        self.stack: list[str] = []  # dotted paths of the modules whose '(' is open
        self.awaiting_stats: dict | None = None

    def open_module(self, path: str, module_type: str, depth: int, parent: str | None) -> dict:
        row = dict(
            step=self.step,
            module=path,
            parent=parent,
            depth=depth,
            module_type=module_type,
            params=None,
            macs=None,
            flops=None,
            latency_ns=None,
            bwd_latency_ns=None,
        )
        self.modules.append(row)
        return row


def parse(path: Path, rank: int = 0) -> Parsed:
    out = Parsed(sources=[str(path)])
    try:
        f = open(path, errors="replace")
    except OSError as exc:
        return out.unreadable(path, exc)
    profiles: list[_Profile] = []
    prof: _Profile | None = None
    in_tree = False
    with f:
        for number, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            where = f"line {number}"
            if _BANNER in line:
                prof, in_tree = _Profile(None), False
                profiles.append(prof)
                continue
            if prof is None:
                continue
            if (m := _STEP.search(line)) and prof.step is None:
                prof.step = int(m.group(1))
                continue
            if "Detailed Profile per GPU" in line:
                in_tree = True
                continue
            if not in_tree:
                if (m := _SUMMARY.match(line)) and not line.startswith(" "):
                    prof.summary[m.group("key").strip().lower()] = m.group("value")
                continue
            try:
                _tree_line(prof, line)
            except ValueError as exc:
                out.problem(path, where, f"{exc}; module figures left empty")
    if not profiles:
        out.problem(path, "", "no 'DeepSpeed Flops Profiler' report in this file")
    for prof in profiles:
        _apply_summary(prof, out, path)
        for row in prof.modules:
            out.add("flops", rank, where, **row)
    return out


def _tree_line(prof: _Profile, line: str) -> None:
    stripped = line.strip()
    if prof.awaiting_stats is not None:
        row, prof.awaiting_stats = prof.awaiting_stats, None
        stats = _STATS.match(stripped)
        if stats:
            row.update(_figures(stats))
            return
        if not stripped.startswith("("):
            raise ValueError(f"expected the figures of module {row['module']!r}, got {stripped[:60]!r}")
    if stripped == ")":
        if prof.stack:
            prof.stack.pop()
        return
    if not stripped or stripped == "..." or stripped.startswith("---"):
        return
    if not prof.stack and not line.startswith(" "):
        m = _ROOT.match(line)
        if m is None:
            return  # notes between the header and the tree
        row = prof.open_module("", m.group("type"), 0, None)
        _after_paren(prof, row, m.group("rest"), "")
        return
    m = _CHILD.match(line)
    if m is None or not prof.stack:
        raise ValueError(f"not a module line: {stripped[:60]!r}")
    parent = prof.stack[-1]
    name = m.group("name")
    dotted = f"{parent}.{name}" if parent else name
    row = prof.open_module(dotted, m.group("type"), dotted.count(".") + 1, parent)
    _after_paren(prof, row, m.group("rest"), dotted)


def _after_paren(prof: _Profile, row: dict, rest: str, dotted: str) -> None:
    """What follows 'Type(': nothing (children follow), '...)' (collapsed) or figures."""
    rest = rest.strip()
    if rest in ("...)", ")"):
        return
    if rest == "":
        prof.stack.append(dotted)
        prof.awaiting_stats = row
        return
    stats = _STATS.match(rest)
    if stats is None:
        raise ValueError(f"cannot read the figures of module {dotted!r}: {rest[:60]!r}")
    row.update(_figures(stats))
    if not rest.endswith(")"):
        prof.stack.append(dotted)  # old format: figures on the opening line, children follow


def _apply_summary(prof: _Profile, out: Parsed, path: Path) -> None:
    s = prof.summary
    if "world size" in s:
        try:
            out.world_size = max(out.world_size or 0, int(s["world size"]))
        except ValueError:
            out.problem(path, "", f"world size {s['world size']!r} is not a number")
    root = next((r for r in prof.modules if r["module"] == ""), None)
    if root is None:
        return
    for key, column, unit, scale in (
        ("fwd flops per gpu", "flops", "", 1),
        ("bwd latency", "bwd_latency_ns", "s", 1e9),
    ):
        if key in s:
            try:
                root[column] = round(parse_metric(s[key], unit) * scale)
            except ValueError as exc:
                out.problem(path, "", f"summary {key!r}: {exc}")
