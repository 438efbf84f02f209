"""A fake run's story: ``FakeRun`` and every table's columns as functions of (seed, rank,
instance or step); the runs the dashboard's tests open (``FINISHED``, ``LIVE``) and the
wire-protocol tests' ``uniform_run``. What the story is: collector.testing.fake_runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa

from collector.data import layout
from collector.data.bandwidth import bus_factor
from collector.data.schema import TABLES
from collector.tools.simulate import hash_uniform
from proto import pb

START = datetime(2026, 11, 20, 9, 0, tzinfo=timezone.utc)
# What a fake run's story writes: every table but the watchdog's (collector.testing.liveness adds
# those for a hang) and captured evidence (a rank's answers to the collector's own requests).
STORY_TABLES = frozenset(TABLES) - {"inflight", "heartbeats", "stacks", "artifacts", "probes"}
HOSTS = ("node-a", "node-a", "node-b", "node-b")  # rank r runs on HOSTS[r % 4]

# (op, group, bytes S as nccl-tests defines it); one step issues this pattern.
COLLECTIVES = (
    ("all_reduce", "world", 256 << 10),
    ("all_reduce", "world", 512 << 10),
    ("all_reduce", "world", 768 << 10),
    ("all_reduce", "world", 25 << 20),
    ("all_reduce", "world", 50 << 20),
    ("reduce_scatter", "zero", 32 << 20),
    ("all_gather", "zero", 32 << 20),
    ("all_gather", "zero", 2 << 20),
)

FLOPS_TREE = (  # module, parent, type, params, macs per sample, share of fwd latency
    ("", None, "GPT", 0, 0, 1.0),
    ("embed", "", "Embedding", 3_200_000, 0, 0.02),
    ("layers", "", "ModuleList", 0, 0, 0.9),
    ("layers.0", "layers", "Block", 0, 0, 0.45),
    ("layers.1", "layers", "Block", 0, 0, 0.45),
    ("layers.0.attn", "layers.0", "Attention", 1_050_000, 1_000_000_000, 0.25),
    ("layers.0.mlp", "layers.0", "MLP", 2_100_000, 2_000_000_000, 0.2),
    ("layers.1.attn", "layers.1", "Attention", 1_050_000, 1_000_000_000, 0.25),
    ("layers.1.mlp", "layers.1", "MLP", 2_100_000, 2_000_000_000, 0.2),
    ("head", "", "Linear", 3_200_000, 1_600_000_000, 0.08),
)
PROFILE_STEP = 10  # the step the flops tree is reported at (the last step of shorter runs)

TIMERS = (("fwd", 100e6), ("bwd", 160e6), ("allreduce", 60e6), ("step", 30e6))  # name, mean ns
MEMORY = (("params", 500e6), ("grads", 500e6), ("optimizer", 2e9), ("rss", 3e9), ("device", 0.0))  # kind, bytes
MOE_LAYERS, MOE_EXPERTS, MOE_CAPACITY, MOE_TOKENS = 2, 8, 96, 512
BAD_PARAM = "layers.1.mlp.fc1.weight"  # what an overflow step blames
OVERFLOW_FIRST_RANK = 1
SAMPLES_PER_RANK_STEP = 32
TOKENS_PER_SAMPLE = 128


PIPE_MICRO_BATCHES, PIPE_FWD_NS = 8, 4_000_000  # backward takes twice the forward


def _one_f_one_b(stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """The 1F1B order of one stage (trainer.pipe.schedule's; collector does not import trainer)."""
    warmup = min(stages - stage - 1, m)
    order = [("fwd", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("fwd", warmup + i), ("bwd", i)]
    return order + [("bwd", i) for i in range(m - warmup, m)]


class FakeRunError(ValueError):
    """A FakeRun that cannot be generated; the message names the field."""


@dataclass(frozen=True, kw_only=True)
class FakeRun:
    run_id: str
    name: str = ""  # what attach(run=...) would have said; '' = the run_id
    world_size: int = 4
    steps: int = 50
    status: str = "finished"  # or "failed"; "running": no RunEnd, so no rank_ends rows
    start: datetime = START
    # the story
    late_rank: int | None = -1  # enters every all_reduce delay_ns late; -1: the last rank; None: nobody
    delay_ns: int = 40_000_000
    late_rank_tokens: float = 1.0  # the late rank trains on this many times the others' tokens (input imbalance)
    overflow_steps: tuple[int, ...] = (5, 12, 20, 21, 33, 40)
    with_moe: bool = True
    with_pipe: bool = True  # pipe rows of a balanced 2-stage pipeline (no findings)
    # what the comm records look like
    collectives: tuple[tuple[str, str, int], ...] = COLLECTIVES
    collectives_per_step: int = 0  # 0: the pattern once; more repeats it (to scale a run up)
    step_period_ns: int = 400_000_000  # room for the late rank's delay inside a step
    jitter_ns: int = 400_000  # each arrival is up to this much later than planned
    latency_ns: int = 600_000  # per-collective fixed cost: small messages are latency bound
    bytes_per_ns: float = 2.0  # the link: 2 GB/s
    sparse_comm_rows: int = 0  # per rank, barriers with most columns left out (stored as NULLs)
    # (rank, ns): that rank's clock runs ns ahead of rank 0's and its Hello's offset missed it (the
    # estimate was skipped or wrong), so every time it records (comm, timers, samples) is ns off
    skewed_clocks: tuple[tuple[int, int], ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        try:
            layout.check_run_id(self.run_id)
        except layout.RunIdError as exc:
            raise FakeRunError(f"FakeRun.run_id: {exc}") from None
        if self.world_size < 1 or self.steps < 1:
            raise FakeRunError(f"FakeRun.world_size and .steps must be >= 1, got {self.world_size}, {self.steps}")
        if self.late_rank == -1:
            object.__setattr__(self, "late_rank", self.world_size - 1)
        if self.late_rank is not None and not 0 <= self.late_rank < self.world_size:
            raise FakeRunError(f"FakeRun.late_rank: {self.late_rank} is not a rank of a world of {self.world_size}")
        if self.status not in ("finished", "failed", "running"):
            raise FakeRunError(f"FakeRun.status: {self.status!r} is not 'finished', 'failed' or 'running'")
        if not self.collectives:
            raise FakeRunError("FakeRun.collectives: at least one (op, group, bytes) is needed")
        for op, _, size in self.collectives:
            if size < 0:
                raise FakeRunError(f"FakeRun.collectives: {op} has a negative size {size}")
        for name in ("delay_ns", "jitter_ns", "latency_ns", "sparse_comm_rows", "collectives_per_step"):
            if getattr(self, name) < 0:
                raise FakeRunError(f"FakeRun.{name} must be >= 0, got {getattr(self, name)}")
        if self.step_period_ns // 2 // self.per_step < 1:
            raise FakeRunError(
                f"FakeRun.step_period_ns: {self.step_period_ns} ns leaves no room for "
                f"{self.per_step} collectives a step"
            )
        if self.bytes_per_ns <= 0:
            raise FakeRunError(f"FakeRun.bytes_per_ns must be > 0, got {self.bytes_per_ns}")
        for rank, _ in self.skewed_clocks:
            if not 0 <= rank < self.world_size:
                raise FakeRunError(f"FakeRun.skewed_clocks: {rank} is not a rank of a world of {self.world_size}")

    # ---- shape --------------------------------------------------------------------------
    @property
    def display_name(self) -> str:
        return self.name or self.run_id

    @property
    def per_step(self) -> int:
        return self.collectives_per_step or len(self.collectives)

    @property
    def instances(self) -> int:
        """Collectives the sinks write per rank: every step's pattern."""
        return self.steps * self.per_step

    @property
    def t0_ns(self) -> int:
        return _unix_ns(self.start)

    @property
    def end(self) -> datetime:
        return self.start + timedelta(microseconds=self.steps * self.step_period_ns // 1000)

    def skew_ns(self, rank: int) -> int:
        """How far ``rank``'s recorded times are off rank 0's time line (skewed_clocks)."""
        return sum(ns for r, ns in self.skewed_clocks if r == rank)

    def client_id(self, rank: int) -> str:
        return f"fake-{self.run_id}-{rank}"

    def config(self) -> dict:
        """The DeepSpeed config the run claims to have trained with."""
        return {
            "train_batch_size": SAMPLES_PER_RANK_STEP * self.world_size,
            "fp16": {"enabled": True},
            "zero_optimization": {"stage": 2, "reduce_bucket_size": 500_000_000},
            "comms_logger": {"enabled": True},
        }

    # ---- rows -----------------------------------------------------------------------------
    def comm_columns(self, rank: int, first: int = 0, n: int | None = None) -> dict:
        """Comm records of ``rank`` for collective instances [first, first + n) (default: to the
        end of the run), numbered across steps; columns as encode_batch takes them."""
        n = self.instances - first if n is None else n
        if first < 0 or n < 0:
            raise FakeRunError(
                f"FakeRun.comm_columns: no instances [{first}, {first + n}) in a run of {self.instances}"
            )
        ops, groups, sizes = (np.array([c[i] for c in self.collectives]) for i in range(3))
        slot = np.arange(self.per_step) % len(self.collectives)  # pattern entry of each place in a step
        ops, groups, sizes = ops[slot], groups[slot], sizes[slot].astype(np.int64)
        # seq counts instances per group: a group's k-th collective of a step, after its earlier steps'
        seq_in_step = np.zeros(self.per_step, dtype=np.int64)
        per_group: dict[str, int] = {}
        for j, g in enumerate(groups):
            seq_in_step[j] = per_group.get(g, 0)
            per_group[g] = seq_in_step[j] + 1
        group_count = np.array([per_group[g] for g in groups], dtype=np.int64)
        is_allreduce = ops == "all_reduce"

        i = np.arange(first, first + n, dtype=np.int64)
        step, j = i // self.per_step, i % self.per_step
        period = self.step_period_ns
        planned = self.t0_ns + step * period + period // 4 + j * (period // 2 // self.per_step)
        story_delay = np.where(is_allreduce[j] & (self.late_rank is not None), self.delay_ns, 0)
        late = story_delay if rank == self.late_rank else 0
        jitter = (hash_uniform(self.seed, rank, i) * self.jitter_ns).astype(np.int64)
        start = planned + late + jitter + self.skew_ns(rank)
        # every rank finishes together, once the last arrival is in and the data has moved
        transfer = (self.latency_ns + sizes / self.bytes_per_ns).astype(np.int64)
        end = planned + story_delay + self.jitter_ns + transfer[j] + self.skew_ns(rank)
        nbytes = sizes[j]
        algbw = nbytes / (end - start)  # bytes/ns == GB/s
        factors = np.array([bus_factor(op, self.world_size) for op in ops])
        return {
            "step": step,
            "group_name": groups[j].tolist(),
            "group_size": np.full(n, self.world_size),
            "seq": step * group_count[j] + seq_in_step[j],
            "op": ops[j].tolist(),
            "log_name": ops[j].tolist(),
            "dtype": ["float32"] * n,
            "numel": nbytes // 4,
            "bytes": nbytes,
            "start_ns": start,
            "end_ns": end,
            "async_op": np.zeros(n, dtype=bool),
            "algbw_gbs": algbw,
            "busbw_gbs": algbw * factors[j],
            "peer": np.full(n, -1),
        }

    def sparse_comm_columns(self, rank: int) -> dict:
        """``sparse_comm_rows`` barriers with only step, op, times and bytes: a producer that
        leaves columns out, which the collector stores as NULLs."""
        k = np.arange(self.sparse_comm_rows, dtype=np.int64)
        start = self.t0_ns + (k % self.steps) * self.step_period_ns + rank * 1000 + self.skew_ns(rank)
        return {
            "step": k % self.steps,
            "op": ["barrier"] * len(k),
            "start_ns": start,
            "end_ns": start + 8_000,
            "bytes": np.zeros(len(k), dtype=np.int64),
        }

    def step_columns(self, rank: int) -> dict[str, dict]:
        """Per-step tables of ``rank``: timers, monitor, loss_scale, memory, gc, host, batches, between_steps,
        pipe, moe."""
        steps = np.arange(self.steps, dtype=np.int64)
        t = self.t0_ns + steps * self.step_period_ns + self.skew_ns(rank)
        rng = np.random.default_rng([self.seed, rank, 1])
        out = {}

        dur = np.array([d for _, d in TIMERS])[None, :] * rng.uniform(0.95, 1.05, (self.steps, len(TIMERS)))
        if rank == self.late_rank:
            dur[:, [name for name, _ in TIMERS].index("allreduce")] += self.delay_ns
        dur = dur.astype(np.int64)
        begin = t[:, None] + np.cumsum(dur, axis=1) - dur
        out["timers"] = {
            "step": np.repeat(steps, len(TIMERS)),
            "name": [n for n, _ in TIMERS] * self.steps,
            "start_ns": begin.ravel(),
            "dur_ns": dur.ravel(),
        }

        # The loss and the learning rate are the run's, the same on every rank.
        loss = 4.0 * np.exp(-steps / 30) + 0.05 * np.random.default_rng([self.seed, 0, 0]).standard_normal(self.steps)
        lr = 1e-3 * np.minimum(1, (steps + 1) / 10)
        samples = (steps + 1) * SAMPLES_PER_RANK_STEP * self.world_size
        tags = ["Train/Samples/train_loss", "Train/Samples/lr"]
        out["monitor"] = {
            "step": np.repeat(steps, 2),
            "tag": tags * self.steps,
            "value": np.stack([loss, lr], axis=1).ravel(),
            "samples": np.repeat(samples, 2),
            "time_ns": np.repeat(t + self.step_period_ns, 2),
        }

        before, after = self._loss_scales()
        overflow = np.isin(steps, self.overflow_steps)
        out["loss_scale"] = {
            "step": steps,
            "scale_before": before,
            "scale": after,
            "overflow": overflow,
            "hysteresis_left": np.full(self.steps, 2),
            "bad_params": [BAD_PARAM if o else None for o in overflow],
            "first_rank": [OVERFLOW_FIRST_RANK if o else None for o in overflow],
            "time_ns": t,
        }

        size = np.array([[b for _, b in MEMORY]] * self.steps)
        size[:, [k for k, _ in MEMORY].index("rss")] += steps * 1e6 * (rank + 1)  # this rank's leak
        out["memory"] = {
            "step": np.repeat(steps, len(MEMORY)),
            "kind": [k for k, _ in MEMORY] * self.steps,
            "bytes": size.astype(np.int64).ravel(),
            "time_ns": np.repeat(t, len(MEMORY)),
        }

        # Root-cause signals: a young-generation GC pause or two per step, and the host as the
        # rank's sampler sees it once a step (busy, no steal, a little run-queue wait).
        gc_count = rng.integers(1, 3, self.steps)
        gc_dur = (gc_count * rng.uniform(30e3, 60e3, self.steps)).astype(np.int64)
        out["gc"] = {
            "step": steps,
            "generation": np.zeros(self.steps, dtype=np.int64),
            "count": gc_count.astype(np.int64),
            "dur_ns": gc_dur,
            "max_ns": gc_dur // gc_count,
            "collected": (gc_count * 10).astype(np.int64),
        }
        out["host"] = {
            "step": steps,
            "time_ns": t + self.step_period_ns,
            "interval_ns": np.full(self.steps, self.step_period_ns, dtype=np.int64),
            "cpu_util": rng.uniform(0.6, 0.9, self.steps),
            "steal": np.zeros(self.steps),
            "runqueue_ns": (rng.uniform(0.0, 0.02, self.steps) * self.step_period_ns).astype(np.int64),
            "cpu_ns": (rng.uniform(0.7, 0.95, self.steps) * self.step_period_ns).astype(np.int64),
            "rss_bytes": np.full(self.steps, 2**30 + rank * 2**20, dtype=np.int64),
            "mem_available_bytes": np.full(self.steps, 16 * 2**30, dtype=np.int64),
        }

        # What the rank trained on: sequences of about the same length on every rank (+-5%), but
        # late_rank_tokens times as many tokens on the late rank.
        heavier = self.late_rank_tokens if rank == self.late_rank else 1.0
        tokens = rng.uniform(0.95, 1.05, self.steps) * SAMPLES_PER_RANK_STEP * TOKENS_PER_SAMPLE * heavier
        out["batches"] = {
            "step": steps,
            "samples": np.full(self.steps, SAMPLES_PER_RANK_STEP, dtype=np.int64),
            "tokens": tokens.astype(np.int64),
        }

        # The wait before each step's first forward, as a hook run records it: a couple of ms, alike
        # on every rank (the late rank is late in its all_reduce, not in its data loading). Drawn from
        # a generator of their own, so the tables drawn after them keep their values.
        gap = np.random.default_rng([self.seed, rank, 2]).uniform(1e6, 3e6, self.steps).astype(np.int64)
        out["between_steps"] = {"step": steps, "start_ns": t - gap, "dur_ns": gap}

        if self.with_pipe:
            out["pipe"] = self.pipe_columns(rank, t - self.skew_ns(rank))

        if self.with_moe:
            # Dirichlet weights falling from expert 0 to the last: a popular expert that drops tokens.
            load = rng.dirichlet(np.linspace(4, 1, MOE_EXPERTS), size=(self.steps, MOE_LAYERS)) * MOE_TOKENS
            tokens = load.astype(np.int64).ravel()
            cells = self.steps * MOE_LAYERS * MOE_EXPERTS
            out["moe"] = {
                "step": np.repeat(steps, MOE_LAYERS * MOE_EXPERTS),
                "layer": np.tile(np.repeat(np.arange(MOE_LAYERS), MOE_EXPERTS), self.steps),
                "expert": np.tile(np.arange(MOE_EXPERTS), self.steps * MOE_LAYERS),
                "tokens": tokens,
                "dropped": np.maximum(0, tokens - MOE_CAPACITY),
                "capacity": np.full(cells, MOE_CAPACITY),
                "aux_loss": np.full(cells, 0.01),
            }
        return out

    def pipe_columns(self, rank: int, step_start_ns: np.ndarray) -> dict:
        """A balanced pipeline: 2 stages (1 for an odd world) x data-parallel replicas, PIPE_MICRO_BATCHES
        micro-batches on the 1F1B schedule with equal stage times, on rank 0's clock (no findings)."""
        stages = 2 if self.world_size % 2 == 0 else 1
        dp = self.world_size // stages
        stage, m = rank // dp, PIPE_MICRO_BATCHES
        ends: dict[tuple[str, int, int], int] = {}  # (kind, stage, micro-batch) -> end offset, all stages
        for _ in range(2 * stages):  # a backward waits for the next stage's: repeat until every wait is known
            for s in range(stages):
                clock, mine = 0, []
                for kind, mb in _one_f_one_b(s, stages, m):
                    dep = ("fwd", s - 1, mb) if kind == "fwd" else ("bwd", s + 1, mb)
                    begin = max(clock, ends.get(dep, 0))
                    clock = ends[(kind, s, mb)] = begin + (PIPE_FWD_NS if kind == "fwd" else 2 * PIPE_FWD_NS)
                    mine.append((kind, mb, begin, clock))
                if s == stage:
                    ours = mine
        mine = ours
        n = len(mine)
        offsets = np.array([[b, e] for _, _, b, e in mine], dtype=np.int64)
        return {
            "step": np.repeat(np.arange(self.steps, dtype=np.int64), n),
            "stage": np.full(self.steps * n, stage),
            "stages": np.full(self.steps * n, stages),
            "data_rank": np.full(self.steps * n, rank % dp),
            "micro_batches": np.full(self.steps * n, m),
            "layers": np.full(self.steps * n, 4),
            "kind": [k for k, *_ in mine] * self.steps,
            "micro_batch": np.tile([mb for _, mb, *_ in mine], self.steps),
            "start_ns": (step_start_ns[:, None] + offsets[None, :, 0]).ravel(),
            "end_ns": (step_start_ns[:, None] + offsets[None, :, 1]).ravel(),
        }

    def _loss_scales(self) -> tuple[np.ndarray, np.ndarray]:
        """fp16 dynamic loss scale before and after each step: halves on an overflow, doubles
        every tenth step otherwise."""
        before, after, scale = [], [], 2.0**16
        for step in range(self.steps):
            before.append(scale)
            scale = scale / 2 if step in self.overflow_steps else scale * (2 if step % 10 == 9 else 1)
            after.append(scale)
        return np.array(before), np.array(after)

    def flops_columns(self, rank: int) -> dict:
        """The module tree at PROFILE_STEP; parents sum their children, as the profiler's do."""
        params = {m: p for m, _, _, p, _, _ in FLOPS_TREE}
        macs = {m: c for m, _, _, _, c, _ in FLOPS_TREE}
        for m, parent, *_ in sorted(FLOPS_TREE, key=lambda row: -row[0].count(".") - bool(row[0])):
            if parent is not None:
                params[parent] += params[m]
                macs[parent] += macs[m]
        slow = 1.3 if rank == self.late_rank else 1.0
        return {
            "step": [min(PROFILE_STEP, self.steps - 1)] * len(FLOPS_TREE),
            "module": [m for m, *_ in FLOPS_TREE],
            "parent": [row[1] for row in FLOPS_TREE],
            "depth": [m.count(".") + 1 if m else 0 for m, *_ in FLOPS_TREE],
            "module_type": [row[2] for row in FLOPS_TREE],
            "params": [params[m] for m, *_ in FLOPS_TREE],
            "macs": [macs[m] for m, *_ in FLOPS_TREE],
            "flops": [2 * macs[m] for m, *_ in FLOPS_TREE],
            "latency_ns": [int(60e6 * row[5] * slow) for row in FLOPS_TREE],
            "bwd_latency_ns": [int(120e6 * row[5] * slow) for row in FLOPS_TREE],
        }

    def comm_arrow(self, rank: int, first: int = 0, n: int | None = None) -> pa.Table:
        """``rank``'s comm rows in the stored schema: instances [first, first + n), then the
        sparse barriers when first is 0."""
        parts = [_stored("comm", rank, self.comm_columns(rank, first, n))]
        if first == 0 and self.sparse_comm_rows:
            parts.append(_stored("comm", rank, self.sparse_comm_columns(rank)))
        return pa.concat_tables(parts)

    def other_tables(self, rank: int) -> dict[str, pa.Table]:
        """``rank``'s rows of every table but comm, in the stored schema (moe only with_moe)."""
        out = {table: _stored(table, rank, columns) for table, columns in self.step_columns(rank).items()}
        out["flops"] = _stored("flops", rank, self.flops_columns(rank))
        return out

    def comm_chunks(self, steps_per_chunk: int) -> list[tuple[int, int]]:
        """(first instance, count) of each chunk of ``steps_per_chunk`` steps."""
        size = steps_per_chunk * self.per_step
        return [(first, min(size, self.instances - first)) for first in range(0, self.instances, size)]

    def hello(self, rank: int) -> pb.Hello:
        return pb.Hello(
            run_id=self.run_id,
            run_name=self.display_name,
            rank=rank,
            world_size=self.world_size,
            host=HOSTS[rank % len(HOSTS)],
            pid=1000 + rank,
            clock_offset_ns=7 * rank,
            started_at_ns=self.t0_ns,
            source="engine",
            config_json=json.dumps(self.config()),
        )


# The two runs the dashboard's tests open: one finished, one still streaming (and without MoE).
FINISHED = FakeRun(run_id="run-a1", name="gpt-small-4r")
LIVE = FakeRun(
    run_id="run-b2",
    name="gpt-small-live",
    steps=20,
    status="running",
    with_moe=False,
    start=datetime(2026, 11, 21, 9, 0, tzinfo=timezone.utc),
)


def uniform_run(
    run_id: str = "r", *, group: str = "world", group_size: int = 4, late_rank: int | None = None, delay_ns: int = 0
) -> FakeRun:
    """The wire-protocol tests' run: 1 KiB all_reduces on one group, ten to a step and 1 µs
    apart, no jitter, so ``late_rank`` arrives exactly ``delay_ns`` after the others."""
    return FakeRun(
        run_id=run_id,
        world_size=group_size,
        collectives=(("all_reduce", group, 1024),),
        collectives_per_step=10,
        step_period_ns=20_000,
        jitter_ns=0,
        latency_ns=500,
        late_rank=late_rank if delay_ns else None,
        delay_ns=delay_ns,
        overflow_steps=(),
        with_moe=False,
    )


def _unix_ns(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def _stored(table: str, rank: int, columns: dict) -> pa.Table:
    """Columns (any subset) as rows of ``table``'s stored schema; the rest NULL."""
    schema = TABLES[table].arrow_schema()
    n = len(columns["step"])
    arrays = [pa.array(np.full(n, rank), pa.int64())]
    for f in list(schema)[1:]:
        values = columns.get(f.name)
        arrays.append(pa.nulls(n, f.type) if values is None else pa.array(values, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
