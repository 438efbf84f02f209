"""Synthetic runs for the dashboard's tests and benchmark, written to exactly the
storage layout the collector produces (docs/ARCHITECTURE.md "Storage layout"):
``D/parquet/<table>/run=<run_id>/<segment>.parquet`` with the schemas of
collector/schema.py, then the catalog of views over them.

The story the data tells is known in advance so tests can check the dashboard
finds it: rank 3 arrives late to every all_reduce (+40 ms), the loss scale
overflows at OVERFLOW_STEPS, and experts are unevenly loaded.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from collector.data import layout
from collector.data.bandwidth import bus_factor
from collector.data.catalog import ensure_catalog
from collector.data.schema import RANK_ENDS_SCHEMA, RANKS_SCHEMA, RUNS_SCHEMA, TABLES

DELAYED_RANK = 3
DELAY_NS = 40_000_000
OVERFLOW_STEPS = (5, 12, 20, 21, 33, 40)
HOSTS = ("node-a", "node-a", "node-b", "node-b")

# (op, group, bytes S as nccl-tests defines it); one step issues this pattern.
COLLECTIVES = (
    ("all_reduce", "world", 256 << 10), ("all_reduce", "world", 512 << 10),
    ("all_reduce", "world", 768 << 10), ("all_reduce", "world", 25 << 20),
    ("all_reduce", "world", 50 << 20),
    ("reduce_scatter", "zero", 32 << 20), ("all_gather", "zero", 32 << 20),
    ("all_gather", "zero", 2 << 20),
)
LATENCY_NS = 600_000          # per-collective fixed cost: small messages are latency bound
LINK_BYTES_PER_NS = 2.0       # 2 GB/s effective
STEP_PERIOD_NS = 400_000_000  # room for the straggler's delay inside a step


@dataclass(frozen=True)
class SyntheticRun:
    run_id: str
    name: str
    world_size: int = 4
    steps: int = 50
    status: str = "finished"          # "running" writes no rank_ends
    collectives_per_step: int = len(COLLECTIVES)  # repeats the pattern to scale up
    with_moe: bool = True
    start: datetime = datetime(2026, 11, 20, 9, 0, tzinfo=timezone.utc)


def _write(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = layout.temp_name(path)  # renamed into place, as the collector does
    pq.write_table(table, tmp)
    tmp.rename(path)


def _table(name: str, cols: dict) -> pa.Table:
    return pa.Table.from_pydict(cols, schema=TABLES[name].arrow_schema())


def _part(data_dir: Path, table: str, run_id: str, segment: str) -> Path:
    return data_dir / "parquet" / table / f"run={run_id}" / f"{segment}.parquet"


def _comm_chunk(run: SyntheticRun, steps: np.ndarray, rng: np.random.Generator) -> list[dict]:
    """Comm records for a block of steps, one dict of columns per rank."""
    n, per_step = run.world_size, run.collectives_per_step
    pattern = [COLLECTIVES[i % len(COLLECTIVES)] for i in range(per_step)]
    ops = np.array([p[0] for p in pattern])
    groups = np.array([p[1] for p in pattern])
    sizes = np.array([p[2] for p in pattern], dtype=np.int64)
    # seq counts instances per group: index within the group's share of each step.
    seq_in_step = np.zeros(per_step, dtype=np.int64)
    per_group = {}
    for i, g in enumerate(groups):
        seq_in_step[i] = per_group.get(g, 0)
        per_group[g] = seq_in_step[i] + 1
    group_count = np.array([per_group[g] for g in groups], dtype=np.int64)

    base0 = int(run.start.timestamp() * 1e9)
    slot = (STEP_PERIOD_NS // 2) // per_step
    base = (base0 + steps[:, None] * STEP_PERIOD_NS + STEP_PERIOD_NS // 4
            + np.arange(per_step)[None, :] * slot)                       # (S, C)
    jitter = rng.exponential(200_000, size=(len(steps), per_step, n)).astype(np.int64)
    late = np.zeros(n, dtype=np.int64)
    late[DELAYED_RANK % n] = DELAY_NS
    is_allreduce = (ops == "all_reduce")[None, :, None]
    starts = base[:, :, None] + jitter + np.where(is_allreduce, late[None, None, :], 0)
    transfer = (LATENCY_NS + sizes / LINK_BYTES_PER_NS).astype(np.int64)   # (C,)
    ends = starts.max(axis=2, keepdims=True) + transfer[None, :, None]    # all finish together
    factors = np.array([bus_factor(o, n) for o in ops])

    out = []
    for r in range(n):
        st_r, en_r = starts[:, :, r].ravel(), ends[:, :, 0].ravel()
        dur = en_r - st_r
        b = np.tile(sizes, len(steps))
        algbw = b / dur  # bytes/ns == GB/s
        out.append({
            "rank": np.full(st_r.size, r), "step": np.repeat(steps, per_step),
            "group_name": np.tile(groups, len(steps)), "group_size": np.full(st_r.size, n),
            "seq": (steps[:, None] * group_count[None, :] + seq_in_step[None, :]).ravel(),
            "op": np.tile(ops, len(steps)), "log_name": np.tile(ops, len(steps)),
            "dtype": np.full(st_r.size, "float32"), "numel": b // 4, "bytes": b,
            "start_ns": st_r, "end_ns": en_r, "async_op": np.zeros(st_r.size, dtype=bool),
            "algbw_gbs": algbw, "busbw_gbs": algbw * np.tile(factors, len(steps)),
            "peer": np.full(st_r.size, -1),
        })
    return out


def _per_step_tables(run: SyntheticRun, rng: np.random.Generator) -> dict[str, list[dict]]:
    """timers, monitor, loss_scale, memory, moe rows for every rank and step."""
    rows: dict[str, list[dict]] = {t: [] for t in ("timers", "monitor", "loss_scale", "memory", "moe")}
    base0 = int(run.start.timestamp() * 1e9)
    scale = 2.0 ** 16
    for step in range(run.steps):
        overflow = step in OVERFLOW_STEPS
        before, scale = scale, (scale / 2 if overflow else scale * (2 if step % 10 == 9 else 1))
        t = base0 + step * STEP_PERIOD_NS
        loss = 4.0 * np.exp(-step / 30) + 0.05 * rng.standard_normal()
        for r in range(run.world_size):
            late = DELAY_NS if r == DELAYED_RANK else 0
            at = t
            for name, dur in (("fwd", 100e6), ("bwd", 160e6), ("allreduce", 60e6 + late), ("step", 30e6)):
                dur_ns = int(dur * rng.uniform(0.95, 1.05))
                rows["timers"].append(dict(rank=r, step=step, name=name, start_ns=at, dur_ns=dur_ns))
                at += dur_ns
            for tag, value in (("Train/Samples/train_loss", loss), ("Train/Samples/lr", 1e-3 * min(1, (step + 1) / 10))):
                rows["monitor"].append(dict(rank=r, step=step, tag=tag, value=float(value),
                                            samples=(step + 1) * 32 * run.world_size, time_ns=t + STEP_PERIOD_NS))
            rows["loss_scale"].append(dict(rank=r, step=step, scale_before=before, scale=scale, overflow=overflow,
                                           hysteresis_left=2, bad_params="layers.1.mlp.fc1.weight" if overflow else None,
                                           first_rank=1 if overflow else None, time_ns=t))
            for kind, size in (("params", 500e6), ("grads", 500e6), ("optimizer", 2e9),
                               ("rss", 3e9 + step * 1e6 * (r + 1)), ("device", 0.0)):
                rows["memory"].append(dict(rank=r, step=step, kind=kind, bytes=int(size), time_ns=t))
            if run.with_moe:
                for layer in range(2):
                    load = rng.dirichlet(np.linspace(4, 1, 8)) * 512  # expert 0 popular
                    for expert, tokens in enumerate(load.astype(int)):
                        rows["moe"].append(dict(rank=r, step=step, layer=layer, expert=expert, tokens=int(tokens),
                                                dropped=max(0, int(tokens) - 96), capacity=96, aux_loss=0.01))
    return rows


FLOPS_TREE = (  # module, parent, type, params, macs per sample, share of fwd latency
    ("", None, "GPT", 0, 0, 1.0),
    ("embed", "", "Embedding", 3_200_000, 0, 0.02),
    ("layers", "", "ModuleList", 0, 0, 0.9),
    ("layers.0", "layers", "Block", 0, 0, 0.45), ("layers.1", "layers", "Block", 0, 0, 0.45),
    ("layers.0.attn", "layers.0", "Attention", 1_050_000, 1_000_000_000, 0.25),
    ("layers.0.mlp", "layers.0", "MLP", 2_100_000, 2_000_000_000, 0.2),
    ("layers.1.attn", "layers.1", "Attention", 1_050_000, 1_000_000_000, 0.25),
    ("layers.1.mlp", "layers.1", "MLP", 2_100_000, 2_000_000_000, 0.2),
    ("head", "", "Linear", 3_200_000, 1_600_000_000, 0.08),
)


def _flops_rows(run: SyntheticRun, profile_step: int = 10) -> list[dict]:
    # Parents sum their children so the tree is consistent like the profiler's.
    params = {m: p for m, _, _, p, _, _ in FLOPS_TREE}
    macs = {m: c for m, _, _, _, c, _ in FLOPS_TREE}
    for m, parent, *_ in sorted(FLOPS_TREE, key=lambda row: -row[0].count(".") - bool(row[0])):
        if parent is not None:
            params[parent] += params[m]
            macs[parent] += macs[m]
    rows = []
    for r in range(run.world_size):
        slow = 1.3 if r == DELAYED_RANK else 1.0
        for m, parent, mtype, _, _, share in FLOPS_TREE:
            rows.append(dict(rank=r, step=profile_step, module=m, parent=parent, depth=0 if m == "" else m.count(".") + 1,
                             module_type=mtype, params=params[m], macs=macs[m], flops=2 * macs[m],
                             latency_ns=int(60e6 * share * slow), bwd_latency_ns=int(120e6 * share * slow)))
    return rows


def _columns(rows: list[dict], table: str) -> dict:
    names = TABLES[table].arrow_schema().names
    return {c: [row.get(c) for row in rows] for c in names}


def write_run(data_dir: Path, run: SyntheticRun, steps_per_segment: int = 50, seed: int = 0) -> None:
    """Write one run's Parquet files (not the catalog)."""
    rng = np.random.default_rng(seed)
    data_dir = Path(data_dir)
    for first in range(0, run.steps, steps_per_segment):
        steps = np.arange(first, min(run.steps, first + steps_per_segment))
        for r, cols in enumerate(_comm_chunk(run, steps, rng)):
            _write(_part(data_dir, "comm", run.run_id, f"rank{r}-{first:06d}"), _table("comm", cols))
    for table, rows in _per_step_tables(run, rng).items():
        if rows:
            _write(_part(data_dir, table, run.run_id, "seg-000000"), _table(table, _columns(rows, table)))
    _write(_part(data_dir, "flops", run.run_id, "seg-000000"), _table("flops", _columns(_flops_rows(run), "flops")))

    config = {"train_batch_size": 32 * run.world_size, "fp16": {"enabled": True},
              "zero_optimization": {"stage": 2, "reduce_bucket_size": 500_000_000},
              "comms_logger": {"enabled": True}}
    _write(_part(data_dir, "runs", run.run_id, "hello"), pa.Table.from_pylist([dict(
        run_id=run.run_id, name=run.name, world_size=run.world_size, started_at=run.start,
        source="engine", linked_run_id=None, config=json.dumps(config))], schema=RUNS_SCHEMA))
    _write(_part(data_dir, "ranks", run.run_id, "hello"), pa.Table.from_pylist([dict(
        run_id=run.run_id, rank=r, host=HOSTS[r % len(HOSTS)], pid=1000 + r, clock_offset_ns=0,
        client_id=f"c{r}", started_at=run.start) for r in range(run.world_size)], schema=RANKS_SCHEMA))
    if run.status != "running":
        end = run.start + timedelta(microseconds=run.steps * STEP_PERIOD_NS / 1000)
        _write(_part(data_dir, "rank_ends", run.run_id, "end"), pa.Table.from_pylist([dict(
            run_id=run.run_id, rank=r, status=run.status, ended_at=end, dropped_records=0)
            for r in range(run.world_size)], schema=RANK_ENDS_SCHEMA))


FINISHED = SyntheticRun(run_id="run-a1", name="gpt-small-4r")
LIVE = SyntheticRun(run_id="run-b2", name="gpt-small-live", steps=20, status="running", with_moe=False,
                    start=datetime(2026, 11, 21, 9, 0, tzinfo=timezone.utc))


def make_data_dir(data_dir: Path, runs: tuple[SyntheticRun, ...] = (FINISHED, LIVE)) -> Path:
    """A data dir holding the given synthetic runs and a catalog over them."""
    data_dir = Path(data_dir)
    for i, run in enumerate(runs):
        write_run(data_dir, run, seed=i)
    ensure_catalog(data_dir)
    return data_dir
