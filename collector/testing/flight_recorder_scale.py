"""Flight Recorder dumps of a 1,024-rank job, EXPANDED FROM THE REAL DUMPS OF A SMALL gloo JOB.

1,024 real processes are out of reach of a test machine, so the big job's dumps are made from a small
real one's:

- ``run_small_job``: ``world`` real ranks (torch.distributed on gloo, torch's Flight Recorder on
  through ``TORCH_FR_BUFFER_SIZE``) run ``steps`` training steps on a TP x DP layout -- each step two
  all_reduces of the rank's TP group, an all_gather_into_tensor and a reduce_scatter_tensor of its DP
  group, an all_reduce of the world -- and in the last step rank ``culprit`` never enters the world
  all_reduce: every other rank waits in it and dumps (the way collector/testing/flight_recorder_corpus.py
  stalls a case, with its ``_Rank``); the culprit dumps without having entered it. Its ``fr_trace/``
  folder holds every rank's dump as torch wrote it (``_dump_fr_trace``, with stacks), its ``pg_config``
  listing each group of the rank with its members, as NCCL's dumps do.
- ``expand``: ``ranks // world`` copies ("blocks") of the small job side by side, one job: rank
  ``b * world + r`` is a copy of small rank ``r``'s dump. The world group becomes the big job's world
  (same name, all ``ranks`` members); every other group becomes one group per block, with a name of its
  own (``pg_config``, each entry's ``process_group`` and ``pg_id``, ``pg_status`` renamed together) and
  the block's ranks as members. Sizes, ops, dtypes, sequence ids, record ids, states, times and stacks
  are the source rank's own, but for a world all_gather's output and a world reduce_scatter's input,
  whose first dimension is the group's size: that grows with the world (an all_to_all, gather or
  scatter of the world is refused: its sizes are per member). The fault stays in one block only (``fault_block``):
  in every other block the culprit's copy is given the entries its group peers have and it lacks --
  each one a peer's real entry for that same collective, renumbered as the culprit's next
  ``record_id``/``op_id`` -- so the big job has exactly one missing rank.

The expanded dumps are pickles named ``nccl_trace_rank_<r>`` (NCCL's default
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), with the keys torch writes (``version``, ``pg_config``,
``pg_status``, ``comm_lib_version``, ``entries``, ``rank``): ``rankscope fr`` and torch's analyzer
(``python -m torch.distributed.flight_recorder.fr_trace DIR -p nccl_trace_rank_``) read the same files.

    python -m collector.testing.flight_recorder_scale OUT [--ranks 1024 --small 8 --steps 40]
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import pickle
import sys
import time
from pathlib import Path

CASE = "scale_world_hang"
PREFIX = "nccl_trace_rank_"


# -- the small real job -------------------------------------------------------------------------


def _small_launch(rank: int, port: int, out: str, world: int, tp: int, steps: int, culprit: int) -> None:
    import torch
    import torch.distributed as dist

    from collector.testing.flight_recorder_corpus import WORLD_TIMEOUT_S, _describe, _Rank
    from collector.testing.gloo import torchrun_env

    torchrun_env(rank, world, port, TORCH_FR_BUFFER_SIZE=str(steps * 5 + 100))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=WORLD_TIMEOUT_S))
    r = _Rank(rank, world, Path(out))
    r.begin(CASE)
    w = r.world_group()
    tps = [r.group(list(range(i, i + tp))) for i in range(0, world, tp)]  # every rank makes every group
    dps = [r.group(list(range(j, world, tp))) for j in range(tp)]
    mine_tp, mine_dp, dp = tps[rank // tp], dps[rank % tp], world // tp
    t = torch.ones(8 * dp)
    for step in range(steps):
        dist.all_reduce(t, group=mine_tp)
        dist.all_reduce(t, group=mine_tp)
        dist.all_gather_into_tensor(torch.zeros(t.numel() * dp), t, group=mine_dp)
        dist.reduce_scatter_tensor(torch.zeros(t.numel() // dp), t, group=mine_dp)
        if step < steps - 1:
            dist.all_reduce(t, group=w)
    r.stall(w, steps, lambda: dist.all_reduce(t, group=w), [culprit], f"{PREFIX}{rank}")
    if rank == 0:
        _describe(
            Path(out),
            CASE,
            fault="hang",
            group="world",
            members=list(range(world)),
            seq=steps,
            op="all_reduce",
            missing=[culprit],
            tp=tp,
            steps=steps,
        )
    sys.stdout.flush()
    os._exit(0)


def run_small_job(
    out: str | os.PathLike, world: int = 8, tp: int = 2, steps: int = 40, culprit: int | None = None
) -> Path:
    """The small real job's case folder (``dumps/``, ``fr_trace/``, ``case.json``) under ``out``."""
    from collector.testing.gloo import join_ranks, start_ranks

    culprit = world - 1 if culprit is None else culprit
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = start_ranks(_small_launch, world, str(out), world, tp, steps, culprit)
    join_ranks(ctx, timeout=600)
    case = out / CASE
    if not (case / "case.json").exists():
        raise AssertionError(f"the small job's ranks exited without writing {case / 'case.json'}")
    return case


# -- the expansion ------------------------------------------------------------------------------


def _members(cfg: dict) -> list[int]:
    return sorted(ast.literal_eval(cfg["ranks"]))


# ops whose one side is the group's size times the other: that side's first dimension grows with the world
_GATHERS = {"all_gather", "allgather", "_allgather_base", "all_gather_into_tensor", "_all_gather_base"}
_SCATTERS = {"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor"}
_SIZED_BY_GROUP = {"all_to_all", "alltoall", "alltoall_base", "gather", "scatter", "all_gather_coalesced"}


def _in_bigger_world(e: dict, times: int) -> dict:
    """A world group's entry as the same call makes it in a world ``times`` as big."""
    op = str(e["profiling_name"]).split(":", 1)[-1]
    side = "output_sizes" if op in _GATHERS else "input_sizes" if op in _SCATTERS else None
    if op in _SIZED_BY_GROUP:
        raise ValueError(f"cannot expand a world {op}: its sizes are per member")
    if side is None:
        return e
    return dict(e, **{side: [[s[0] * times, *s[1:]] if s else s for s in e[side]]})


def _key(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def expand(src: str | os.PathLike, out: str | os.PathLike, ranks: int, fault_block: int | None = None) -> dict:
    """The small job's ``fr_trace/`` dumps in ``src`` as ``ranks`` ranks' dumps in ``out``; returns what
    the expanded job holds: ``ranks``, ``blocks``, ``missing`` (the big job's ranks without the entries
    their peers have), ``group``/``seq``/``op`` of the hang when there is one, ``entries`` written."""
    src, out = Path(src), Path(out)
    small = {int(p.name.rsplit("_", 1)[1]): pickle.loads(p.read_bytes()) for p in src.glob("rank_*")}
    world = len(small)
    if sorted(small) != list(range(world)) or ranks % world:
        raise ValueError(f"{src}: need dumps of ranks 0..n-1 with n dividing {ranks}; have {sorted(small)}")
    blocks = ranks // world
    fault_block = blocks - 3 if fault_block is None else fault_block
    configs = {name: cfg for d in small.values() for name, cfg in d["pg_config"].items()}
    worlds = {name for name, cfg in configs.items() if _members(cfg) == list(range(world))}
    subs = sorted(set(configs) - worlds, key=_key)
    if not all(n.isdigit() for n in configs):
        raise ValueError(f"{src}: process group names are not torch's numbered ones: {sorted(configs)}")
    top = 1 + max(int(n) for n in configs)

    def name_in(name: str, block: int) -> str:
        return name if name in worlds else str(top + block * len(subs) + subs.index(name))

    # per group: its members' entries by seq (a peer's real entry fills in a copy of the culprit)
    by_seq: dict[str, dict[int, dict]] = {}
    for r in sorted(small):
        for e in small[r]["entries"]:
            if not e.get("is_p2p"):
                by_seq.setdefault(str(e["process_group"][0]), {}).setdefault(int(e["collective_seq_id"]), e)
    lacking: dict[int, list[dict]] = {}  # small rank -> the entries its group peers have and it lacks
    status_of: dict[tuple[int, str], dict] = {}
    for r, d in small.items():
        have = {(str(e["process_group"][0]), int(e["collective_seq_id"])) for e in d["entries"]}
        extra = sorted(
            (e for g in d["pg_config"] for s, e in by_seq.get(g, {}).items() if (g, s) not in have),
            key=lambda e: (e["time_created_ns"], e["record_id"]),
        )
        if extra:
            lacking[r] = extra
            for g in {str(e["process_group"][0]) for e in extra}:
                peer = next(p for p in sorted(small) if g in small[p]["pg_config"] and p != r)
                if g in small[peer]["pg_status"]:
                    status_of[(r, g)] = small[peer]["pg_status"][g]
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for b in range(blocks):
        names = {g: name_in(g, b) for g in configs}
        for r, d in small.items():
            entries = list(d["entries"])
            status = dict(d["pg_status"])
            if r in lacking and b != fault_block:
                last_record = max((e["record_id"] for e in entries), default=-1)
                last_op = max((e.get("op_id", 0) for e in entries), default=0)
                mine = {k: entries[-1][k] for k in ("thread_id", "thread_name") if entries and k in entries[-1]}
                for i, e in enumerate(lacking[r], 1):
                    entries.append(dict(e, record_id=last_record + i, op_id=last_op + i, **mine))
                for (rr, g), st in status_of.items():
                    if rr == r:
                        status[g] = st
            big = []
            for e in entries:
                g = str(e["process_group"][0])
                if g in worlds:
                    e = _in_bigger_world(e, blocks)
                elif g in names:
                    e = dict(e, process_group=(names[g], e["process_group"][1]), pg_id=int(names[g]))
                big.append(e)
            pg_config = {
                names[g]: dict(
                    cfg, ranks=str(list(range(ranks)) if g in worlds else [b * world + m for m in _members(cfg)])
                )
                for g, cfg in d["pg_config"].items()
            }
            dump = dict(
                d,
                pg_config=pg_config,
                pg_status={names.get(g, g): st for g, st in status.items() if g in names},
                entries=big,
                rank=b * world + r,
            )
            (out / f"{PREFIX}{b * world + r}").write_bytes(pickle.dumps(dump))
            written += len(big)
    facts = {"ranks": ranks, "blocks": blocks, "small_world": world, "entries": written}
    facts["missing"] = [fault_block * world + r for r in sorted(lacking)]
    hung = {
        (str(e["process_group"][0]), int(e["collective_seq_id"]), e["profiling_name"])
        for v in lacking.values()
        for e in v
    }
    if len(hung) == 1:
        (g, seq, op) = hung.pop()
        facts.update(group="world" if g in worlds else name_in(g, fault_block), seq=seq, op=op.split(":", 1)[-1])
    return facts


# -- torch's analyzer ---------------------------------------------------------------------------


def analyzer_verdicts(dumps: str | os.PathLike, prefix: str = PREFIX, *args: str) -> list[dict]:
    """``python -m torch.distributed.flight_recorder.fr_trace DUMPS -p PREFIX`` run in this process,
    its verdicts parsed (collector.testing.flight_recorder_corpus.fr_trace_verdicts)."""
    from collector.testing.flight_recorder_corpus import fr_trace_verdicts

    return fr_trace_verdicts(dumps, prefix, *args)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m collector.testing.flight_recorder_scale", description=__doc__)
    p.add_argument("out")
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--small", type=int, default=8, help="ranks of the small real gloo job")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--steps", type=int, default=40, help="the small job's steps (5 collectives each)")
    args = p.parse_args(argv)
    started = time.monotonic()
    case = run_small_job(Path(args.out) / "small", args.small, args.tp, args.steps)
    ran = time.monotonic() - started
    facts = expand(case / "fr_trace", Path(args.out) / "dumps", args.ranks)
    print(json.dumps(facts), f"(small job {ran:.1f} s, expansion {time.monotonic() - started - ran:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
