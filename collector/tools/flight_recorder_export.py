"""``rankscope export --flight-recorder RUN DIR``: one PyTorch Flight Recorder dump per rank
(``DIR/rank_<r>``, a pickle as NCCL's watchdog writes), for torch's own analyzer:

    python -m torch.distributed.flight_recorder.fr_trace DIR -p rank_

A rank's dump holds its collectives in seq order: each completed one (a ``comm`` row) as a
``completed`` entry, each still open (the ``inflight_open`` view: entered, not completed, the rank
not ended) as ``started``, with the times rankscope recorded. Groups keep the hook's names as pg
names; ``world`` is the default group (``default_pg``). An entry's sizes come from ``numel`` (the
op's data size S) and the group size: all_gather's input is S / n, reduce_scatter's output S / n.
p2p rows (``p2p[a->b]`` groups) are left out. The ops the analyzer knows run under their
``nccl:`` names (so it matches them as NCCL's would be); where it refuses a record, it says which.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from collector.data import catalog
from collector.tools.export import ExportError, resolve_run

VERSION = "2.10"  # the dump format torch 2.13 writes
PREFIX = "rank_"
# our op -> Flight Recorder's profiling name (what torch records for that call)
FR_OPS = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "allreduce_coalesced",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "_all_gather_base",
    "all_gather_coalesced": "ALLGATHER_coalesced",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
}
_GATHERS = {"all_gather", "all_gather_into_tensor", "all_gather_coalesced", "gather"}
_SCATTERS = {"reduce_scatter", "reduce_scatter_tensor", "scatter"}
# torch dtype names (comm.dtype) -> c10 ScalarType names (what Flight Recorder records)
FR_DTYPES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
}

_ROWS = """
    SELECT rank, group_name, group_size, seq, op, dtype, numel, start_ns, end_ns, 'completed' AS state
    FROM comm WHERE run_id = $run AND seq IS NOT NULL AND NOT starts_with(group_name, 'p2p[')
    UNION ALL
    SELECT rank, group_name, group_size, seq, op, dtype, numel, entered_ns, NULL, 'started'
    FROM inflight_open WHERE run_id = $run AND NOT starts_with(group_name, 'p2p[')
    ORDER BY rank, start_ns NULLS LAST, group_name, seq"""


def _desc(group: str) -> str:
    return "default_pg" if group == "world" else group


def _members(group: str, size: int, world: int) -> list[int]:
    if group == "world" or not group.startswith("g["):
        return list(range(world if group == "world" else size))
    out = []
    for part in group[2:].split("]")[0].split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _sizes(op: str, numel: int, n: int) -> tuple[list, list]:
    """(input_sizes, output_sizes) of an op moving S = ``numel`` elements in a group of ``n``."""
    numel = numel or 0
    if op in _GATHERS:
        return [[numel // max(n, 1)]], [[numel]]
    if op in _SCATTERS:
        return [[numel]], [[numel // max(n, 1)]]
    return [[numel]], [[numel]]


def export_flight_recorder(data_dir, run: str, outdir) -> dict:
    con = catalog.connect(data_dir)
    try:
        run_id = resolve_run(con, run)
        (world,) = con.execute("SELECT world_size FROM runs WHERE run_id = ?", [run_id]).fetchone()
        rows = con.execute(_ROWS, {"run": run_id}).fetchall()
    finally:
        con.close()
    world = int(world or 0) or 1 + max((r[0] for r in rows), default=0)
    groups: dict[str, list[int]] = {}
    dumps: dict[int, list[dict]] = {r: [] for r in range(world)}
    for rank, group, size, seq, op, dtype, numel, start, end, state in rows:
        members = groups.setdefault(group, _members(group, int(size or world), world))
        inputs, outputs = _sizes(op, numel, len(members))
        fr_dtype = FR_DTYPES.get(dtype, dtype or "Float")
        entries = dumps.setdefault(rank, [])
        entries.append(
            {
                "record_id": len(entries),
                "pg_id": list(groups).index(group),
                "process_group": (group, _desc(group)),
                "collective_seq_id": int(seq),
                "p2p_seq_id": 0,
                "op_id": int(seq),
                "profiling_name": f"nccl:{FR_OPS.get(op, op)}",
                "time_created_ns": int(start or 0),
                "input_sizes": inputs,
                "input_dtypes": [fr_dtype] * len(inputs),
                "output_sizes": outputs,
                "output_dtypes": [fr_dtype] * len(outputs),
                "state": state,
                "time_discovered_started_ns": int(start) if start else None,
                "time_discovered_completed_ns": int(end) if end else None,
                "duration_ms": (end - start) / 1e6 if start and end else None,
                "retired": state == "completed",
                "timeout_ms": 0,
                "is_p2p": False,
                "thread_name": "",
                "thread_id": "",
                "frames": [],
            }
        )
    pg_config = {g: {"name": g, "desc": _desc(g), "ranks": str(m)} for g, m in groups.items()}
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for rank, entries in sorted(dumps.items()):
        dump = {"version": VERSION, "pg_config": pg_config, "pg_status": {}, "comm_lib_version": "", "entries": entries}
        path = outdir / f"{PREFIX}{rank}"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(pickle.dumps(dump, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)
    if not rows:
        raise ExportError(f"run {run_id} has no collectives to export")
    return {"run_id": run_id, "ranks": len(dumps), "entries": len(rows), "groups": len(groups)}
