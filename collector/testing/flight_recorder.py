"""torch's Flight Recorder as the oracle for collective identity, in tests of scripts users write.

torch 2.13 records Flight Recorder entries for gloo too when ``TORCH_FR_BUFFER_SIZE`` is set. A
script under test calls ``dump(out)`` at its end (before ``destroy_process_group``): each rank
writes its entries and the map from Flight Recorder's process-group names to the group names of
rankscope's ``comm`` rows. ``mismatches`` then holds every comm row of a rank against the entry
Flight Recorder has at the same (process group, ``collective_seq_id``): same op and same size,
or it says what differs.

Op kinds: on gloo some ops run as another collective (torch 2.13's gloo reduce_scatter_tensor is an
all_reduce of the whole input; all_gather_into_tensor an all_gather), so each of our ops maps to
the Flight Recorder names it may appear under. Sizes compare our ``numel`` (the op's data size S in
elements, nccl-tests' definition) with the entry's input or output sizes, per op.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

# our op -> (Flight Recorder's names for it, which side of the entry holds S: "in", "out" or "none")
FR_NAMES = {
    "all_reduce": ({"all_reduce", "allreduce"}, "in"),
    "all_reduce_coalesced": ({"all_reduce_coalesced", "allreduce_coalesced"}, "in"),
    "all_gather": ({"all_gather", "allgather"}, "out"),
    "all_gather_into_tensor": ({"all_gather", "allgather", "_allgather_base", "all_gather_into_tensor"}, "out"),
    "all_gather_coalesced": ({"all_gather_coalesced", "allgather_coalesced"}, "out"),
    "reduce_scatter": ({"reduce_scatter", "all_reduce", "allreduce"}, "in"),
    "reduce_scatter_tensor": ({"reduce_scatter", "_reduce_scatter_base", "all_reduce", "allreduce"}, "in"),
    "all_to_all": ({"all_to_all", "alltoall", "alltoall_base"}, "in"),
    "all_to_all_single": ({"all_to_all", "alltoall", "alltoall_base"}, "in"),
    "broadcast": ({"broadcast"}, "in"),
    "reduce": ({"reduce"}, "in"),
    "gather": ({"gather"}, "out"),
    "scatter": ({"scatter"}, "in"),
    "barrier": ({"barrier"}, "none"),
}


def dump(out: str | os.PathLike) -> None:
    """This rank's Flight Recorder entries and group names, to ``out/fr<rank>.json``."""
    import torch
    import torch.distributed as dist

    from collector.rank.recorder import REC

    groups = {}
    for pg, g in list(REC.groups.items()):
        pg = pg if pg is not None else dist.group.WORLD  # the recorder keys the world group by None too
        if pg is not None:
            groups[str(getattr(pg, "group_name", ""))] = g.name
    trace = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, True))
    path = Path(out) / f"fr{dist.get_rank()}.json"
    path.write_text(json.dumps({"groups": groups, "entries": trace.get("entries", [])}))


def load(out: str | os.PathLike, rank: int) -> dict:
    return json.loads((Path(out) / f"fr{rank}.json").read_text())


def _elements(sizes: list) -> int:
    return sum(math.prod(s) for s in sizes)


def mismatches(rows: list[dict], fr: dict) -> list[str]:
    """Every comm row (``group_name, seq, op, numel``) that Flight Recorder does not confirm."""
    by_key = {}
    names = fr["groups"]
    for e in fr["entries"]:
        if e.get("is_p2p"):
            continue
        pg_name = str(e["process_group"][0])
        by_key[(names.get(pg_name, f"?{pg_name}"), int(e["collective_seq_id"]))] = e
    problems = []
    for row in rows:
        if row["group_name"].startswith("p2p["):
            continue
        entry = by_key.get((row["group_name"], int(row["seq"])))
        what = f"{row['group_name']} #{row['seq']} {row['op']} x{row['numel']}"
        if entry is None:
            problems.append(f"{what}: no Flight Recorder entry at that seq")
            continue
        fr_op = entry["profiling_name"].split(":", 1)[-1]
        allowed, side = FR_NAMES.get(row["op"], ({row["op"]}, "in"))
        if fr_op not in allowed:
            problems.append(f"{what}: Flight Recorder has {fr_op} there")
            continue
        if side != "none":
            fr_numel = _elements(entry["input_sizes"] if side == "in" else entry["output_sizes"])
            if fr_numel != int(row["numel"]):
                problems.append(f"{what}: Flight Recorder has {fr_op} of {fr_numel} elements there")
    return problems
