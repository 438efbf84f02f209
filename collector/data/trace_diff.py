"""Where a suspect rank's time went, from two torch.profiler traces: the suspect's and a healthy
reference's, each over a few steps (collector.rank.capture; stored by collector.server.artifacts).

Per step (each trace's time divided by the steps it covers) and per name, in three families:

* ``python``: Python functions (``with_stack``), e.g. ``slow_loader`` (``train.py:12``);
* ``scope``: ``record_function`` scopes and module annotations;
* ``operator``: aten/c10d operators (``aten::mm``).

A name's time is the union of its intervals on each thread, so a recursive function or an op
nested in itself is not counted twice, and a caller includes its callees (inclusive time).
Python functions are those of the training thread (the one with the most operator time): the
rank's background threads spend their lives waiting on locks, which says nothing about its steps.
Object addresses are cut from names (``<built-in method acquire of ... at 0x7f..>`` -> ``acquire``)
so the same function has the same name on both ranks. The headline names the Python functions the
suspect spends the most extra time in, caller first (``slow_loader → sleep``), then the largest
operator whose time is equal on both ("aten::mm equal"); the reference's extra time is usually
its wait in a collective for the suspect.

``merged`` lays the two traces side by side as one Perfetto/Chrome JSON (one process per rank,
each trace starting at 0). ``evidence`` reads a run's ``artifacts`` rows and diffs each capture
that has a suspect and a reference.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import duckdb

FAMILIES = {"python_function": "python", "user_annotation": "scope", "cpu_op": "operator"}
TOP_LINES = 5  # per family
CHAIN_SHARE = 0.6  # a function is on the slow path when it holds this share of the top extra time
EQUAL_MS = 0.5  # deltas within this (or EQUAL_SHARE of the time) are "equal"
EQUAL_SHARE = 0.1
_PY_NAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.+)$")
_BUILTIN = re.compile(r"^<built-in (?:function|method) (?P<func>[^ >]+)")


def load(path) -> dict:
    """A stored trace (gzip'd JSON, or plain JSON)."""
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def display_name(family: str, name: str) -> str:
    """``train.py(12): slow_loader`` -> ``slow_loader (train.py:12)``; ``<built-in function sleep>`` -> ``sleep``."""
    if family != "python":
        return name
    if m := _PY_NAME.match(name):
        return f"{m['func']} ({Path(m['file']).name}:{m['line']})"
    return name


def canonical(family: str, name: str) -> str:
    """The name without what differs between processes (a built-in's bound object and address)."""
    if family == "python" and (m := _BUILTIN.match(name)):
        return m["func"]
    return name


def short_name(family: str, name: str) -> str:
    shown = display_name(family, name)
    return shown.split(" (", 1)[0] if family == "python" else shown


def _training_thread(events: list[dict]) -> object:
    """The thread with the most operator time."""
    busy: dict = defaultdict(float)
    for e in events:
        if e.get("cat") == "cpu_op":
            busy[e.get("tid")] += float(e.get("dur", 0))
    return max(busy, key=busy.get, default=None)


def per_step(trace: dict, steps: int) -> tuple[dict[str, dict[str, float]], dict[str, set[str]]]:
    """(family -> name -> ms per step, python name -> the python names it was called under)."""
    events = [e for e in trace.get("traceEvents", ()) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    training = _training_thread(events)
    spans: dict[tuple, list] = defaultdict(list)
    parent: dict[int, int] = {}
    python_ids: dict[int, str] = {}
    for e in events:
        family = FAMILIES.get(e.get("cat"))
        if family is None or (family == "python" and e.get("tid") != training):
            continue
        name = canonical(family, e["name"])
        ts = float(e["ts"])
        spans[(family, name, e.get("tid"))].append((ts, ts + float(e["dur"])))
        if family == "python":
            args = e.get("args") or {}
            if (own := args.get("Python id")) is not None:
                python_ids[own] = name
                parent[own] = args.get("Python parent id")
    totals: dict[str, dict[str, float]] = {f: defaultdict(float) for f in FAMILIES.values()}
    for (family, name, _), intervals in spans.items():
        intervals.sort()
        covered, end = 0.0, float("-inf")
        for lo, hi in intervals:
            if hi <= end:
                continue
            covered += hi - max(lo, end)
            end = hi
        totals[family][name] += covered / 1000.0 / max(steps, 1)  # µs -> ms
    return totals, _callers(python_ids, parent)


def _callers(python_ids: dict[int, str], parent: dict[int, int]) -> dict[str, set[str]]:
    """python name -> every other python name found above it on a stack."""
    upto: dict[int, frozenset] = {}  # python id -> its name and every name above it

    def names_upto(pid) -> frozenset:
        chain = []
        while pid in python_ids and pid not in upto and len(chain) < 10_000:
            chain.append(pid)
            pid = parent.get(pid)
        known = upto.get(pid, frozenset())
        for p in reversed(chain):
            known = upto[p] = known | {python_ids[p]}
        return known

    out: dict[str, set[str]] = defaultdict(set)
    for pid, name in python_ids.items():
        out[name] |= names_upto(parent.get(pid)) - {name}
    return out


def diff(
    suspect: dict, reference: dict, *, suspect_rank: int, reference_rank: int, suspect_steps: int, reference_steps: int
) -> dict:
    """The per-step differences of two traces: ``headline`` (one sentence) and ``lines`` (per family,
    largest difference first: name, suspect_ms, reference_ms, delta_ms)."""
    mine, callers = per_step(suspect, suspect_steps)
    theirs, _ = per_step(reference, reference_steps)
    lines = []
    for family in FAMILIES.values():
        names = set(mine[family]) | set(theirs[family])
        rows = [
            {
                "family": family,
                "name": display_name(family, n),
                "suspect_ms": round(mine[family].get(n, 0.0), 3),
                "reference_ms": round(theirs[family].get(n, 0.0), 3),
                "delta_ms": round(mine[family].get(n, 0.0) - theirs[family].get(n, 0.0), 3),
                "_raw": n,
            }
            for n in names
        ]
        rows.sort(key=lambda r: -abs(r["delta_ms"]))
        lines += rows[:TOP_LINES]
    headline = _headline(mine, theirs, callers, suspect_rank, reference_rank)
    for row in lines:
        del row["_raw"]
    return {"suspect": suspect_rank, "reference": reference_rank, "headline": headline, "lines": lines}


def _headline(mine, theirs, callers, suspect_rank: int, reference_rank: int) -> str:
    extra = {n: t - theirs["python"].get(n, 0.0) for n, t in mine["python"].items()}
    top = max(extra.values(), default=0.0)
    if top > EQUAL_MS:
        on_path = {n for n, d in extra.items() if d >= CHAIN_SHARE * top}
        # caller first: by how many of the others were seen above it
        on_path = sorted(on_path, key=lambda n: (len(callers.get(n, set()) & on_path), -extra[n]))
        chain = " → ".join(short_name("python", n) for n in on_path[-2:])
        where = f"+{top:.1f} ms/step in {chain}"
    else:  # no Python stacks (or nothing there): the largest extra operator or scope
        _, name, top = max(
            ((f, n, t - theirs[f].get(n, 0.0)) for f in ("scope", "operator") for n, t in mine[f].items()),
            key=lambda x: x[2],
            default=("operator", "", 0.0),
        )
        if top <= EQUAL_MS:
            return f"rank {suspect_rank} and rank {reference_rank} spend their steps alike (within {EQUAL_MS} ms/step)"
        where = f"+{top:.1f} ms/step in {name}"
    sentence = f"rank {suspect_rank} spends {where} (vs rank {reference_rank})"
    equal = [
        n
        for n, t in sorted(mine["operator"].items(), key=lambda x: -x[1])
        if abs(t - theirs["operator"].get(n, 0.0)) <= max(EQUAL_MS, EQUAL_SHARE * t)
    ]
    return f"{sentence}; {equal[0]} equal" if equal else sentence


def merged(traces: list[tuple[int, str, dict]]) -> dict:
    """One Chrome/Perfetto trace of several ranks side by side: (rank, role, trace) each, one process
    per rank named "rank R (role)", each trace's first event at time 0."""
    events = []
    for rank, role, trace in traces:
        own = [e for e in trace.get("traceEvents", ()) if e.get("ph") != "M" and "ts" in e]
        start = min((float(e["ts"]) for e in own), default=0.0)
        events.append(
            {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank} ({role})"}}
        )
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for e in own:
            events.append({**e, "pid": rank, "ts": float(e["ts"]) - start})
    return {"displayTimeUnit": "ms", "traceEvents": events}


def captures(cat, run_id: str):
    """The run's ``artifacts`` rows, newest first (a DataFrame; empty when there are none)."""
    return cat.df(
        "select rank, step, request_id, kind, status, steps, last_step, path, bytes, reason, finding, role, detail, "
        "time_ns from artifacts where run_id = ? order by time_ns desc",
        [run_id],
    )


def request_rows(cat, run_id: str, request_id: str):
    """One request's ``artifacts`` rows, oldest first; empty where the table is not there yet."""
    try:
        return cat.df(
            "select rank, role, status, step, last_step, detail, time_ns from artifacts "
            "where run_id = ? and request_id = ? order by time_ns",
            [run_id, request_id],
        )
    except duckdb.Error:
        import pandas as pd

        return pd.DataFrame(columns=["rank", "role", "status", "step", "last_step", "detail", "time_ns"])


def run_evidence(cat, data_dir, run_id: str) -> list[dict]:
    """``evidence`` of a run, or [] where its data dir has no ``artifacts`` table yet (written before it)."""
    try:
        rows = captures(cat, run_id)
    except duckdb.Error:
        return []
    return evidence(data_dir, rows)


def attach(finding: dict, found: list[dict]) -> dict:
    """A finding's JSON with ``captured``: the diffs whose suspect it names (none: unchanged)."""
    mine = [e for e in found if e.get("suspect") in finding.get("ranks", ())]
    return {**finding, "captured": mine} if mine else finding


def evidence(data_dir, rows) -> list[dict]:
    """Diffs of each captured profile request with a suspect and a reference, newest first. ``rows``:
    ``captures``. A request of two ranks asked on demand diffs the first named against the second."""
    out = []
    done = rows[(rows.status == "captured") & (rows.kind == "profile")]
    for request_id, group in done.groupby("request_id", sort=False):
        suspects = group[group.role == "suspect"]
        references = group[group.role == "reference"]
        if suspects.empty or references.empty:
            asked = group[group.role == "asked"].sort_values("rank")
            if len(asked) != 2:
                continue
            suspects, references = asked.iloc[:1], asked.iloc[1:]
        ref = references.iloc[0]
        try:
            ref_trace = load(Path(data_dir) / ref.path)
        except (OSError, ValueError) as exc:
            out.append({"request_id": request_id, "error": f"trace of rank {ref['rank']} unreadable: {exc}"})
            continue
        for _, s in suspects.iterrows():
            try:
                result = diff(
                    load(Path(data_dir) / s.path),
                    ref_trace,
                    suspect_rank=int(s["rank"]),
                    reference_rank=int(ref["rank"]),
                    suspect_steps=int(s.steps),
                    reference_steps=int(ref.steps),
                )
            except (OSError, ValueError) as exc:
                out.append({"request_id": request_id, "error": f"trace of rank {s['rank']} unreadable: {exc}"})
                continue
            result.update(
                request_id=request_id,
                finding=s.finding,
                steps=[int(s.step), int(s.last_step)],
                traces={int(s["rank"]): s.path, int(ref["rank"]): ref.path},
            )
            out.append(result)
    return out
