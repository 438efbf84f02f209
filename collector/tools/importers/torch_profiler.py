"""torch.profiler traces: the Chrome-trace JSON that ``prof.export_chrome_trace(path)`` or
``tensorboard_trace_handler`` writes on each rank (``.json``, or ``.json.gz``), one file per rank.

Which rank wrote a trace: ``distributedInfo.rank`` (torch writes it once a process group
exists), else a ``rank<N>`` in the file name (``rank3.json``, ``trace_rank_3.pt.trace.json``;
``tensorboard_trace_handler``'s own names end in a pid, not a rank); the
world size is ``distributedInfo.world_size``. Times are ``baseTimeNanoseconds`` + ``ts`` (µs).

Collectives -> ``comm`` rows. Each collective the rank issued is one ``c10d::<op>`` CPU op
(``c10d::allreduce_``, ``c10d::_allgather_base_``...) on the thread that called it; with
``record_shapes=True`` its ``Input Dims`` give the sizes, which are counted as the hook counts
them (collector.rank.ops.SPECS: a gather's gathered output, a list reduce-scatter's inputs).
gloo runs the collective on one of its ``pt_gloo_runloop`` threads as a ``gloo:<op>`` event
(whose ``Input type`` gives the dtype). Nothing links the two events, so they are paired in
order: gloo's queue hands work to its threads first in, first out, so a collective's worker
event is the first unclaimed ``gloo:`` event of its kind, showing the same tensor shapes, that
starts after it and before its step ends (a list reduce-scatter runs as one ``gloo:all_reduce``
per rank of the group). A step waits for its collectives (DDP for its buckets before the
optimizer step); one whose work has not started when its step ends is reported as unpaired and
left out, never given a made-up end. Where no event of a rank's trace gives the dtype (a
non-root scatter; a trace cut short), the dtype another rank's trace recorded for the same
instance is taken (``settle``, across the traces of one import).

Duration, as close to the hook's (collector.rank.recorder: from entering the collective to its
completion) as the trace allows. A trace taken with ``with_stack=True`` holds the script's Python
calls: a collective called from Python runs from its public torch.distributed call (c10d_logger's
``wrapper``, innermost around the op) to that call's return or the worker's end, whichever is
later -- the hook's boundaries, up to the hook's own few µs. Otherwise ``start_ns`` is the
``c10d::`` op's start, ``end_ns`` the later
of its end and its worker event's end (when gloo finished the work). Neither of the hook's
boundaries is in such a trace, which holds no Python frames and no ``wait()``: the hook stamps
before the torch.distributed Python wrapper (30-70 µs earlier, measured) and, for a synchronous
op, after the caller woke from ``wait()`` (10-600 µs later on a loaded host); an async op's
worker event also runs the future's completion callbacks, the hook's among them, so either end
may come first. Measured against the hook on the same gloo DDP run (7 runs, per-size medians):
DDP's async bucket all_reduces -1.5% to +6.4%, synchronous collectives 4-84% shorter here
(tests/integration/tools/test_import_torch_profiler.py). Without ``gloo:`` events (NCCL: the
work runs on the GPU, and these CPU events end when it is enqueued) the op's CPU span is all
the trace gives: such rows say when the op was issued, not how long it ran, and a tensor-list op
has no dtype. NCCL also writes ``record_param_comms`` events with the group, the group's seq and
the dtype; they are not read (untested: no GPU where this was built), and gloo in torch 2.13
writes none.

Group and seq: a gloo trace names no process group per op. Where its ``distributedInfo`` lists one
group, every row is the ``world``'s; where it lists several, each collective's group is decided
across the import's traces from the worker thread that ran it (profiler_groups), and a trace
without worker events is reported and its collectives left out. ``seq`` is the collective's
number in the trace (in its group), from 1 in issue order: the same instance on every rank as
long as every rank's trace covers the same steps (a ``torch.profiler.schedule`` does), but not
the process group's own counter, which has also counted the collectives before the trace began.
Point-to-point ops are not imported.

Steps -> ``timers`` rows and each row's ``step``. A ``ProfilerStep#N`` span (``prof.step()``
in the loop) is step N + 1, the hook's numbering when profiling started with the loop
(collector.rank.steps: the collectives leading to the k-th optimizer step are step k); its span
is a ``profiler_step`` timer (the step's extent, so the Stragglers view and ``rankscope
health`` measure the step), with a ``fwd`` timer per ``DistributedDataParallel.forward`` /
``FullyShardedDataParallel.forward`` span and a ``step`` timer per ``Optimizer.step#...``
span inside it. A trace without ``ProfilerStep#`` spans is one step (step 1), its extent the
trace's. Events outside every step span take the step of the span before them (or the first).

A file cut short (a rank killed while writing) is read up to the cut: every whole event before
it counts, and a problem says where the file ended. torch writes a trace thread by thread, so
the gloo worker events (and Python calls) of collectives before the cut may lie past it: a cut
trace's collectives keep their step, seq, op, sizes and start (their c10d op's), and have no end
(NULL) rather than a pairing that cannot be trusted; their dtype comes from the other ranks' traces
where only the worker event held it (``c10d::allreduce_``'s tensor list).

A trace torch wrote malformed is read around the broken events. With ``with_stack=True`` torch
names a Python call from its code object's strings, and for a code object freed before export
(import-time frames) that name is freed memory: control characters, stray quotes, bytes that are
no UTF-8 (pytorch/pytorch#121219, #130622; seen here on a loaded CI host: 83,681 events, one
of them broken). Control characters inside strings are accepted; an event that still does not
parse is skipped up to the next event's start. Skipped Python-call events are one note (they
only place a collective's start and end within its Python call); any other skipped event is a
problem naming where it was.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
from pathlib import Path
from typing import NamedTuple

from collector.data import bandwidth
from collector.tools.importers import base, profiler_groups
from collector.tools.importers.base import Parsed

NAME = "torch_profiler"
MAX_BYTES = 1 << 30  # a profiled step of a large model writes tens of MiB; a gzipped trace is read whole


class _Spec(NamedTuple):
    op: str  # the comm table's op (collector.rank.ops names)
    size_arg: int  # the argument whose elements are counted (and whose type may give the dtype)
    times_group: bool  # counted once per rank of the group (a gather's output, a list reduce-scatter's inputs)
    workers: tuple[str, ...]  # the gloo worker events it runs as
    local_arg: int | None  # the argument whose shapes the worker event shows (None: not comparable)


C10D_OPS = {
    "allreduce_": _Spec("all_reduce", 0, False, ("all_reduce",), 0),
    "allreduce_coalesced_": _Spec("all_reduce_coalesced", 0, False, ("all_reduce",), 0),
    "broadcast_": _Spec("broadcast", 0, False, ("broadcast",), 0),
    "reduce_": _Spec("reduce", 0, False, ("reduce",), 0),
    "allgather_": _Spec("all_gather", 1, True, ("all_gather",), 1),
    "_allgather_base_": _Spec("all_gather_into_tensor", 0, False, ("all_gather",), 1),
    "allgather_coalesced_": _Spec("all_gather_coalesced", 1, True, ("all_gather",), 1),
    "allgather_into_tensor_coalesced_": _Spec("all_gather_into_tensor_coalesced", 0, False, ("all_gather",), 1),
    "reduce_scatter_": _Spec("reduce_scatter", 0, True, ("all_reduce", "reduce_scatter"), 0),
    "_reduce_scatter_base_": _Spec("reduce_scatter_tensor", 1, False, ("all_reduce", "reduce_scatter"), 1),
    "reduce_scatter_tensor_coalesced_": _Spec(
        "reduce_scatter_tensor_coalesced", 1, False, ("all_reduce", "reduce_scatter"), 1
    ),
    "alltoall_": _Spec("all_to_all", 1, False, ("all_to_all",), 1),
    "alltoall_base_": _Spec("all_to_all_single", 1, False, ("all_to_all",), 1),
    "gather_": _Spec("gather", 1, True, ("gather",), 1),
    "scatter_": _Spec("scatter", 0, True, ("scatter",), None),  # the root's event shows every part
    "barrier": _Spec("barrier", 0, False, ("barrier",), None),
}
_P2P = {"send", "recv_", "recv_any_source_"}
# C++ type names in "Input type" -> (torch dtype name as comm.dtype holds it, bytes per element)
DTYPES = {
    "float": ("float32", 4),
    "double": ("float64", 8),
    "c10::Half": ("float16", 2),
    "c10::BFloat16": ("bfloat16", 2),
    "long int": ("int64", 8),
    "int": ("int32", 4),
    "short int": ("int16", 2),
    "signed char": ("int8", 1),
    "unsigned char": ("uint8", 1),
    "bool": ("bool", 1),
    "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16),
    "c10::Float8_e4m3fn": ("float8_e4m3fn", 1),
    "c10::Float8_e5m2": ("float8_e5m2", 1),
}
ITEMSIZE = dict(DTYPES.values())  # comm.dtype -> bytes per element
FORWARD_SPANS = ("DistributedDataParallel.forward", "FullyShardedDataParallel.forward")
_STEP_SPAN = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)")
# With with_stack=True the trace also holds the Python calls: each public torch.distributed
# collective runs inside c10d_logger's ``wrapper`` (torch 2.x), so the innermost such call around a
# c10d op is the collective as the script called it (all_gather_object's all_gathers have their own).
_PUBLIC_CALL = re.compile(r"torch/distributed/c10d_logger\.py\(\d+\): wrapper$")
_CALL_DEPTH = 16


def _head(path: Path) -> bytes:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read(8192)


def detect(path: Path) -> bool:
    if not path.name.endswith((".json", ".json.gz")):
        return False
    try:
        head = _head(path)
    except (OSError, EOFError):
        return False
    return is_trace_head(head)


def is_trace_head(head: bytes) -> bool:
    """Whether a file's first bytes are a Chrome trace's (torch writes its header keys first)."""
    return head.lstrip()[:1] == b"{" and (b'"traceEvents"' in head or b'"distributedInfo"' in head)


def _read(path: Path) -> bytes:
    if not path.name.endswith(".gz"):
        base.check_size(path, MAX_BYTES)
        return path.read_bytes()
    with gzip.open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise base.FileTooCostly(f"over {base.size_text(MAX_BYTES)} once unzipped, the most an import reads of a trace")
    return data


_EVENT_START = re.compile(r',\s*\{\s*"(?:ph|name|cat|pid|tid|ts)"\s*:')
_PYTHON_CALL = re.compile(r'"cat"\s*:\s*"python_function"')


def _load(data: bytes, out: Parsed, path: Path) -> tuple[dict, list, bool]:
    """(the trace's header keys, its events, whether it broke off). A document cut short keeps its
    header and every whole event before the cut, and the cut is reported; a broken event inside
    it is skipped (see the module's docstring)."""
    text = data.decode("utf-8", errors="replace")
    depth = base.json_depth(data)
    if depth > base.MAX_JSON_DEPTH:
        raise base.FileTooCostly(f"JSON nested deeper than {base.MAX_JSON_DEPTH} levels ({depth}); a trace has 5")
    try:
        doc = json.loads(text, strict=False)  # strict=False: control characters inside strings
    except ValueError:
        pass
    else:
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise ValueError("no 'traceEvents' list")
        return doc, doc["traceEvents"], False
    decoder = json.JSONDecoder(strict=False)
    header = {}
    for key in ("distributedInfo", "baseTimeNanoseconds"):
        m = re.search(rf'"{key}"\s*:\s*', text)
        if m:
            try:
                header[key] = decoder.raw_decode(text, m.end())[0]
            except ValueError:
                pass
    m = re.search(r'"traceEvents"\s*:\s*\[', text)
    if not m:
        raise ValueError("no 'traceEvents' list")
    events, at, python_calls_skipped = [], m.end(), 0

    def broke_off(at: int) -> tuple[dict, list, bool]:
        out.problem(
            path,
            f"byte {at}",
            f"the trace breaks off here; the {len(events):,} events before it are read, "
            "its collectives without an end (their gloo worker events may lie past the break)",
        )
        return header, events, True

    while True:
        at = _skip(text, at)
        if at >= len(text):  # no "]": cut short, if only just after a whole event (or what read as one)
            return broke_off(at)
        if text[at] == "]":
            break
        try:
            event, at = decoder.raw_decode(text, at)
        except ValueError:
            after = _EVENT_START.search(text, at + 1)
            if not after:
                return broke_off(at)
            if _PYTHON_CALL.search(text, at, after.start()):
                python_calls_skipped += 1
            else:
                out.problem(path, f"byte {at}", "an event torch wrote malformed; skipped, the events after it are read")
            at = after.start() + 1
            continue
        events.append(event)
    if python_calls_skipped:
        out.hints["python_calls_skipped"] = python_calls_skipped
    return header, events, False


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n,":
        at += 1
    return at


def _rank_of(path: Path, info: dict) -> int | None:
    if type(info.get("rank")) is int:  # not a bool
        return info["rank"]
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def _numel(dims, kind) -> int:
    """Elements of one argument: its ``Input Dims`` are a tensor's shape (``[]``: a 0-d tensor,
    one element), or for a ``TensorList`` a list of shapes."""
    shapes = dims if kind == "TensorList" else [dims] if kind else None
    if not isinstance(shapes, list) or not all(_is_shape(s) for s in shapes):
        raise TypeError("not recorded")
    return sum(math.prod(shape) for shape in shapes)


def _is_shape(shape) -> bool:
    return isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)


class _Steps:
    """The step of a time (ns): ProfilerStep#N spans, sorted; before or between them, the one before."""

    def __init__(self, spans: list[tuple[int, int, int]]) -> None:
        self.spans = sorted(spans)
        self.starts = [s for s, _, _ in self.spans]

    def of(self, t: int) -> int:
        if not self.spans:
            return 1
        return self.spans[max(0, bisect.bisect_right(self.starts, t) - 1)][2]

    def end_of(self, t: int) -> float:
        """When the step span holding ``t`` ends (outside every span: when the next one starts)."""
        at = bisect.bisect_right(self.starts, t)
        if at and t < self.spans[at - 1][1]:
            return self.spans[at - 1][1]
        return self.starts[at] if at < len(self.starts) else math.inf


def parse(path: Path) -> Parsed:
    out = Parsed(sources=[str(path)])
    try:
        header, events, cut = _load(_read(path), out, path)
    except ValueError as exc:
        if isinstance(exc, base.FileTooCostly):
            raise
        out.problem(path, "", f"not a readable torch.profiler trace ({exc}); skipped")
        return out
    info = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    rank = _rank_of(path, info)
    if rank is None:
        out.problem(path, "", "cannot tell which rank wrote this trace: no distributedInfo.rank; name it rank<N>.json")
        return out
    if type(info.get("world_size")) is int:
        out.world_size = info["world_size"]
    base_ns = header.get("baseTimeNanoseconds") or 0  # older torch: ts is µs since the epoch
    if type(base_ns) is not int:
        out.problem(path, "", f"baseTimeNanoseconds is {base_ns!r}, not a number of ns; skipped")
        return out

    def ns(us) -> int:
        return base_ns + round(float(us) * 1000)

    spans, ops, workers, annotations = [], [], [], []
    calls: dict = {}  # thread -> [(start, end)] of its public torch.distributed calls (with_stack)
    first, last = None, None
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            name, start, dur = str(e.get("name", "")), ns(e["ts"]), round(float(e.get("dur", 0)) * 1000)
        except (KeyError, TypeError, ValueError):
            out.problem(path, f"event {i}", "a complete event ('X') without a numeric ts/dur; skipped")
            continue
        first = start if first is None else min(first, start)
        last = start + dur if last is None else max(last, start + dur)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if name.startswith("c10d::"):
            ops.append((start, dur, i, name[6:], args, _thread(e)))
        elif e.get("cat") == "python_function" and _PUBLIC_CALL.search(name):
            calls.setdefault(_thread(e), []).append((start, start + dur))
        elif name.startswith("gloo:"):
            workers.append((start, dur, name[5:], args, _thread(e)))
        elif m := _STEP_SPAN.match(name):
            spans.append((start, start + dur, int(m.group(1)) + 1))
        elif name in FORWARD_SPANS or name.startswith("Optimizer.step#"):
            annotations.append((start, dur, "fwd" if name in FORWARD_SPANS else "step"))
    steps = _Steps(spans)
    for start, end, step in steps.spans:
        out.add("timers", rank, "", step=step, name="profiler_step", start_ns=start, dur_ns=end - start)
    if not spans and first is not None:
        out.add("timers", rank, "", step=1, name="profiler_step", start_ns=first, dur_ns=last - first)
    for start, dur, name in annotations:
        out.add("timers", rank, "", step=steps.of(start), name=name, start_ns=start, dur_ns=dur)
    ops.sort(key=lambda op: (op[0], op[2]))  # issue order
    workers.sort(key=lambda w: w[0])
    for spans_of_thread in calls.values():
        spans_of_thread.sort()
    # a cut trace keeps each collective's c10d start: the events around it may lie past the cut
    _comm_rows(out, path, rank, info, ops, [] if cut else workers, steps, cut, {} if cut else calls)
    return out


def _comm_rows(
    out: Parsed, path: Path, rank: int, info: dict, ops: list, workers: list, steps: _Steps, cut: bool, calls: dict
) -> None:
    collectives = [op for op in ops if op[3] not in _P2P]
    if not collectives:
        return
    groups = profiler_groups.stated(info)
    several = len(groups) > 1
    if several and not workers:
        out.problem(
            path,
            "",
            f"{len(collectives):,} collectives not imported: the trace's ranks are in {len(groups)} process groups, "
            "and without gloo's worker events (NCCL, or a trace cut short) nothing tells which one a collective ran on",
        )
        return
    size = None if several else groups[0].size if groups else info.get("world_size")
    if not several and (type(size) is not int or size < 1):
        out.problem(path, "", "no process group size in distributedInfo; collectives not imported")
        return
    pending = profiler_groups.Pending(rank, groups) if several else None
    claimed = [False] * len(workers)
    worker_starts = [w[0] for w in workers]
    seq = 0
    for start, dur, i, c10d_op, args, tid in collectives:
        where = f"event {i} (c10d::{c10d_op})"
        called = _python_call(calls.get(tid, ()), start, start + dur)
        spec = C10D_OPS.get(c10d_op)
        if spec is None:
            out.problem(path, where, "a collective rankscope does not know; skipped")
            continue
        op, arg, times_group = spec.op, spec.size_arg, spec.times_group
        seq += 1
        end, dtype_name = (None if cut else start + dur), None
        dims, types = _listed(args, "Input Dims"), _listed(args, "Input type")
        if pending and c10d_op == "reduce_scatter_":  # one worker event per member of a group not yet known
            out.problem(path, where, "a list reduce_scatter on one of several process groups; skipped")
            continue
        if workers:
            need = size if c10d_op == "reduce_scatter_" else 1
            shapes = _shapes(dims, types, spec.local_arg)
            window = (start, steps.end_of(start))
            mine = _claim(workers, worker_starts, claimed, window, spec.workers, shapes, need)
            if len(mine) < need:
                out.problem(path, where, f"its gloo:{spec.workers[0]} worker event is not in the trace; skipped")
                continue
            end = max(end, *(workers[j][0] + workers[j][1] for j in mine))
            dtype_name = next(iter(_listed(workers[mine[0]][3], "Input type")), None)
        if called is not None:  # the script's own call: from entering it to its return (after wait())
            start, end = called[0], None if cut else max(end, called[1])
        if arg < len(types) and isinstance(types[arg], str) and types[arg] in DTYPES:
            dtype_name = types[arg]
        dtype, itemsize = DTYPES.get(dtype_name, (dtype_name, None)) if isinstance(dtype_name, str) else (None, None)
        if op == "barrier":
            numel, nbytes = 0, 0
        else:
            try:
                numel = _numel(dims[arg], types[arg]) * (size if times_group and not pending else 1)
            except (IndexError, TypeError):
                out.problem(path, where, "no Input Dims (profile with record_shapes=True); skipped")
                continue
            nbytes = numel * itemsize if itemsize else None
        algbw, busbw = bandwidth.bandwidth(op, nbytes, end - start, size) if nbytes and end and size else (None, None)
        row = dict(
            step=steps.of(start),
            group_name=None if pending else "world",
            group_size=size,
            seq=None if pending else seq,
            op=op,
            log_name=op,
            dtype=dtype,
            numel=numel,
            bytes=nbytes,
            start_ns=start,
            end_ns=end,
            async_op=None,
            algbw_gbs=algbw,
            busbw_gbs=busbw,
        )
        if out.add("comm", rank, where, **row) and pending:  # its group is decided across ranks, in settle
            pending.add(out.rows[("comm", rank)][-1], workers[mine[0]][4], times_group)
    if pending:
        out.hints[profiler_groups.HINT] = pending


def _thread(event: dict):
    """An event's thread id, or None where it is no id (ops and calls pair only on one thread)."""
    tid = event.get("tid")
    return tid if isinstance(tid, (int, str)) and not isinstance(tid, bool) else None


def _python_call(spans: list, start: int, end: int) -> tuple[int, int] | None:
    """The innermost of a thread's public torch.distributed calls (sorted by start) that holds the
    op [start, end], or None (no Python frames in the trace, or an op issued from C++: DDP's
    buckets). Only the last few calls to start before the op are looked at: those are this
    collective's own and the ones around it."""
    j = bisect.bisect_right(spans, (start, math.inf))
    for call_start, call_end in reversed(spans[max(0, j - _CALL_DEPTH) : j]):
        if call_end >= end:
            return call_start, call_end
    return None


def _listed(args: dict, key: str) -> list:
    """An event's ``args[key]`` when it is a list (as torch writes them), else an empty one."""
    value = args.get(key)
    return value if isinstance(value, list) else []


def _shapes(dims: list, types: list, arg: int | None) -> list | None:
    """The shapes of argument ``arg`` as a worker event lists them (one per tensor); None when
    there is nothing to compare."""
    if arg is None or arg >= len(dims) or arg >= len(types) or not types[arg]:
        return None
    return dims[arg] if types[arg] == "TensorList" else [dims[arg]]


def _claim(workers: list, starts: list, claimed: list, window: tuple, names: tuple, shapes, need: int) -> list[int]:
    """Indices of the first ``need`` unclaimed worker events named one of ``names`` that start in
    ``window`` (from the op's start to the end of its step) and show the op's tensors (``shapes``,
    where both sides record them; each of a list reduce-scatter's events shows its output's
    shape), claimed as they are found. The shapes and the step keep one lost event from shifting
    the pairing of the collectives after it."""
    mine = []
    j = bisect.bisect_left(starts, window[0])
    while j < len(workers) and starts[j] < window[1] and len(mine) < need:
        if not claimed[j] and workers[j][2] in names and _fits(_listed(workers[j][3], "Input Dims"), shapes):
            claimed[j] = True
            mine.append(j)
        j += 1
    return mine


def _fits(seen: list, shapes: list | None) -> bool:
    return not seen or shapes is None or seen == shapes


def settle(parsed: list[Parsed]) -> list[str]:
    """Across every rank's trace of one import: a collective whose dtype this rank's trace does not
    hold (a non-root scatter records none; a cut trace lacks the worker events that give it) takes
    the dtype another rank recorded for the same instance (group, seq, op), and its bytes with it.
    Returns the import's notes (the malformed Python-call events each trace had skipped)."""
    notes = [
        f"{p.sources[0]}: {p.hints['python_calls_skipped']:,} Python-call events skipped: torch wrote them "
        "malformed (a freed code object's name, pytorch/pytorch#121219); the collectives and steps are read"
        for p in parsed
        if p.hints.get("python_calls_skipped")
    ]
    notes += profiler_groups.settle(parsed)
    known = {}
    for p in parsed:
        for (table, _), rows in p.rows.items():
            if table == "comm":
                for r in rows:
                    if r["dtype"] is not None:
                        known[(r["group_name"], r["seq"], r["op"])] = r["dtype"]
    for p in parsed:
        for (table, _), rows in p.rows.items():
            if table != "comm":
                continue
            for r in rows:
                dtype = known.get((r["group_name"], r["seq"], r["op"]))
                if r["dtype"] is None and dtype in ITEMSIZE:
                    r["dtype"], r["bytes"] = dtype, r["numel"] * ITEMSIZE[dtype]
                    base.set_bandwidth(r)
    return notes
