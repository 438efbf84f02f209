"""PyTorch Flight Recorder dumps: one per rank, JSON (``_dump_fr_trace_json``) or pickle
(``_dump_fr_trace``, what NCCL's watchdog writes to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``).

A dump is ``{"version", "pg_config": {pg: {"desc", "ranks"}}, "entries": [...]}``; each entry is
one collective a rank issued: its process group, ``collective_seq_id`` (rankscope's ``seq``: the
same number, DESIGN.md's collective identity), ``profiling_name`` ("nccl:all_reduce"), input and
output sizes and dtypes, ``state`` and times, and the Python ``frames`` that issued it.

Which rank wrote a dump: its ``rank`` key where the version has one, else the number its file
name ends in (``fr3.json``, ``nccl_trace_rank_3``). Groups take the hook's names: the default
group is ``world``, another ``g[<ranks>]``.

Completed or in flight: where the backend tracks state (NCCL: a ``time_discovered_*`` time, a
``started``/``completed`` state), the state says. gloo records every entry as ``scheduled``; then an
entry counts as completed when every member of its group entered that seq or a later one (each
rank's dump in the same import), and in flight otherwise -- the match torch's own analyzer
(``torch.distributed.flight_recorder.fr_trace``) makes. A member with no dump has entered nothing.
Completed entries become ``comm`` rows (``start_ns``/``end_ns`` where recorded), in-flight ones
``inflight`` rows (``entered_ns`` = when the entry was made, ``time_ns`` = when the dump was
written, its file's mtime; ``hang_after_s`` = the entry's ``timeout_ms``) and one ``stacks`` row
each from its frames. A run with an in-flight row gets no RunEnd (it is still ``running``), so
the ``hangs`` and ``desyncs`` views and ``rankscope health`` judge it as a live hang. p2p entries
(send/recv) are not imported. Pickles load with no class allowed: a dump holds
only dicts, lists, tuples, strings and numbers, and anything else is refused unexecuted.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
from pathlib import Path

from collector.data.schema import rank_ranges
from collector.tools.importers import base
from collector.tools.importers.base import Parsed

NAME = "flight_recorder"
WORLD_DESC = "default_pg"
_TRACKED_STATES = {"started", "completed"}
# Flight Recorder's op names (after "nccl:"/"gloo:") -> torch.distributed's function names
OPS = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
}
# the side of an entry that holds the op's data size S (nccl-tests): the gathered output for gathers
_OUTPUT_SIDE = {"all_gather", "all_gather_into_tensor", "all_gather_coalesced", "all_gather_into_tensor_coalesced"}
# c10 ScalarType names -> (torch dtype name as comm.dtype holds it, bytes per element)
DTYPES = {
    "Float": ("float32", 4),
    "Double": ("float64", 8),
    "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8),
    "Int": ("int32", 4),
    "Short": ("int16", 2),
    "Char": ("int8", 1),
    "Byte": ("uint8", 1),
    "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1),
}
_RANK_IN_NAME = re.compile(r"(\d+)$")
MAX_STACK_FRAMES = 64  # innermost frames kept, as the hook's stack capture keeps


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a Flight Recorder dump holds no objects, but this one names {module}.{name}")


def _load(path: Path) -> dict | None:
    """The dump in ``path``, or None when it is no Flight Recorder dump."""
    head = path.open("rb").read(1)
    if head == b"\x80":  # a pickle (protocol 2+)
        base.check_size(path, base.MAX_FILE_BYTES)
        data = _DataOnly(io.BytesIO(path.read_bytes())).load()
    elif head == b"{" or path.suffix == ".json":
        data = base.load_json(path, max_bytes=base.MAX_FILE_BYTES)
    else:
        return None
    return data if isinstance(data, dict) and "entries" in data and "pg_config" in data else None


def detect(path: Path) -> bool:
    if "tfevents" in path.name or path.suffix in (".csv", ".parquet", ".txt", ".log", ".py"):
        return False
    with path.open("rb") as f:
        head = f.read(4096)
    if head[:1] == b"\x80":
        return b"pg_config" in head
    # json.dumps sorts the keys: "entries" (long) may come before "pg_config"
    return head[:1] == b"{" and b'"entries"' in head and (b'"comm_lib_version"' in head or b'"pg_config"' in head)


def _rank_of(path: Path, dump: dict) -> int | None:
    if isinstance(dump.get("rank"), int):
        return dump["rank"]
    m = _RANK_IN_NAME.search(path.name.split(".")[0])
    return int(m.group(1)) if m else None


def _groups(dump: dict) -> dict[str, tuple[str, list[int]]]:
    """pg name -> (rankscope's group name, member ranks); WORLD_DESC -> the default group's.
    (torch 2.13 on gloo keys the default group's pg_config by '' while its entries say "0".)"""
    out = {}
    for pg, cfg in (dump.get("pg_config") or {}).items():
        ranks = cfg.get("ranks", "[]")
        ranks = sorted(int(r) for r in (json.loads(ranks) if isinstance(ranks, str) else ranks))
        world = cfg.get("desc") == WORLD_DESC or pg == ""
        out[str(pg)] = ("world" if world else f"g[{rank_ranges(ranks)}]", ranks)
        if world or len(ranks) > len(out.get(WORLD_DESC, ("", []))[1]):
            out.setdefault(WORLD_DESC, ("world", ranks))
    return out


def _elements(sizes) -> int:
    return sum(math.prod(int(d) for d in s) for s in sizes or [])


def _stack(frames: list) -> tuple[str, str]:
    """(the stack as traceback.format_list writes it, innermost frame last; the innermost frame)."""
    frames = list(reversed((frames or [])[:MAX_STACK_FRAMES]))  # Flight Recorder lists the innermost first
    text = "".join(f'  File "{f.get("filename")}", line {f.get("line")}, in {f.get("name")}\n' for f in frames)
    inner = frames[-1] if frames else None
    return text, f"{inner.get('filename')}:{inner.get('line')} in {inner.get('name')}" if inner else ""


def parse(path: Path) -> Parsed:
    out = Parsed(sources=[str(path)])
    try:
        dump = _load(path)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        out.problem(path, "", f"not a readable Flight Recorder dump ({exc}); skipped")
        return out
    if dump is None:
        out.problem(path, "", "not a Flight Recorder dump (no 'entries' and 'pg_config'); skipped")
        return out
    rank = _rank_of(path, dump)
    if rank is None:
        out.problem(path, "", "cannot tell which rank wrote this dump: name it <anything><rank> (fr3.json)")
        return out
    groups = _groups(dump)
    dumped_ns = path.stat().st_mtime_ns
    tracked = any(
        e.get("state") in _TRACKED_STATES or e.get("time_discovered_started_ns") for e in dump.get("entries", [])
    )
    for i, e in enumerate(dump.get("entries", [])):
        where = f"entry {i}"
        if e.get("is_p2p"):
            continue
        pg, desc = [*(e.get("process_group") or []), "", ""][:2]
        pg = str(pg) if str(pg) in groups and desc != WORLD_DESC else desc
        if pg not in groups:
            out.problem(path, where, f"process group {pg!r} is not in pg_config; entry skipped")
            continue
        group, members = groups[pg]
        fr_op = str(e.get("profiling_name", "")).split(":", 1)[-1]
        op = OPS.get(fr_op, fr_op)
        sizes, dtypes = (
            (e.get("output_sizes"), e.get("output_dtypes"))
            if op in _OUTPUT_SIDE
            else (e.get("input_sizes"), e.get("input_dtypes"))
        )
        dtype, itemsize = DTYPES.get((dtypes or ["?"])[0], ((dtypes or [None])[0], None))
        numel = 0 if op == "barrier" else _elements(sizes)
        row = dict(
            step=None,
            group_name=group,
            group_size=len(members),
            seq=int(e["collective_seq_id"]),
            op=op,
            dtype=dtype,
            numel=numel,
            bytes=numel * itemsize if itemsize else None,
        )
        state = e.get("state")
        if tracked and state == "completed":
            start, end = e.get("time_discovered_started_ns") or None, e.get("time_discovered_completed_ns") or None
            out.add("comm", rank, where, **row, log_name=op, start_ns=start, end_ns=end, async_op=None)
            continue
        stack, innermost = _stack(e.get("frames"))
        entered = int(e.get("time_created_ns") or dumped_ns)
        out.add(
            "inflight",
            rank,
            where,
            **row,
            group_ranks=rank_ranges(members),
            entered_ns=entered,
            time_ns=dumped_ns,
            hang_after_s=(e.get("timeout_ms") or 0) / 1000,
            state="waiting",
            _inferred=not tracked,  # settle() decides, across the ranks' dumps
            _stack=(e.get("thread_name"), e.get("thread_id"), stack, innermost),
        )
    out.world_size = max((max(m) + 1 for _, m in groups.values() if m), default=None)
    return out


def settle(parsed: list[Parsed]) -> None:
    """Across every rank's dump of one import: an inferred in-flight entry that every member of its
    group entered (that seq or a later one) was completed: it becomes a comm row. What stays in
    flight gets its stack row."""
    seen: set[tuple[str, int, str, int]] = set()  # a rank dumped twice (JSON and pickle): its entries once
    for p in parsed:
        for (table, rank), rows in p.rows.items():
            if table in ("comm", "inflight"):
                kept = [r for r in rows if (key := (table, rank, r["group_name"], r["seq"])) not in seen]
                seen.update((table, rank, r["group_name"], r["seq"]) for r in kept)
                rows[:] = kept
    entered: dict[tuple[str, int], int] = {}  # (group, rank) -> the highest seq it entered
    for p in parsed:
        for (table, rank), rows in p.rows.items():
            if table in ("comm", "inflight"):
                for r in rows:
                    key = (r["group_name"], rank)
                    entered[key] = max(entered.get(key, 0), r["seq"])
    for p in parsed:
        for (table, rank), rows in list(p.rows.items()):
            if table != "inflight":
                continue
            still = []
            for r in rows:
                members = _members(r["group_ranks"])
                if r.pop("_inferred") and all(entered.get((r["group_name"], m), 0) >= r["seq"] for m in members):
                    r.pop("_stack")
                    done = {k: r[k] for k in ("step", "group_name", "group_size", "seq", "op", "dtype", "numel")}
                    p.rows[("comm", rank)].append(
                        dict(done, bytes=r["bytes"], log_name=r["op"], start_ns=r["entered_ns"], end_ns=None)
                    )
                    continue
                thread_name, thread_id, stack, innermost = r.pop("_stack")
                still.append(r)
                p.rows[("stacks", rank)].append(
                    dict(
                        step=None,
                        reason=f"in flight: {r['op']} #{r['seq']} of {r['group_name']} (Flight Recorder)",
                        thread_name=thread_name,
                        thread_id=int(thread_id) if str(thread_id or "").isdigit() else None,
                        is_main=None,
                        stack=stack,
                        innermost=innermost,
                        time_ns=r["time_ns"],
                    )
                )
            rows[:] = still


def _members(label: str) -> list[int]:
    out = []
    for part in label.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out
