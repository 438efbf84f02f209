"""``rankscope simulate``: a synthetic run of thousands of ranks, to try the dashboard at
scale and to load-test a collector.

Every rank repeats a real engine step (collector/tools/simulate_template.py: the ZeRO-2
sample run's collectives, timers, monitor tags and memory kinds), on a "world" group of all
ranks, with a few hundred microseconds of per-rank jitter. ``--straggler RANK:MS[@STEP]``
makes one rank's forward pass MS slower from STEP on, so it enters every collective of the
step MS late and everyone else waits for it -- the story ``rankscope health`` and the
Stragglers page must tell.

Values are a pure function of (seed, rank, step), generated for a block of ranks at a time
with numpy, so memory stays bounded (one block) at any size and the same arguments give the
same run whichever way it is delivered:

- ``--data-dir D``: straight into D through the collector's own Store (collector/server/store.py:
  the same ledger, segment names and Parquet settings as a running collector; one block of
  ranks is one submission), then the catalog. Fails clearly if a collector holds D.
- ``--endpoint E``: through a live collector, one gRPC stream per rank as real ranks send
  them, multiplexed over one channel from this process (collector/tools/importers/sink.py),
  at most ``--streams`` streams open at a time; returns once every record is durable.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from collector.data import catalog, layout
from collector.data.bandwidth import bus_factor
from collector.data.codec import envelope_rows
from collector.data.schema import TABLES
from collector.tools import simulate_template
from collector.tools.importers.sink import GrpcSink, SinkError, envelope, table_batches
from proto import pb

GROUP = "world"
JITTER_NS = 300_000  # each rank enters a collective up to this much after its planned time
BLOCK_RANKS = 64  # ranks generated (and submitted) together
T0_NS = 1_795_000_000_000_000_000  # 2026-11-19: a fixed start, so a simulation is reproducible


class SimulateError(ValueError):
    """Arguments that cannot describe a run; the message names the option."""


@dataclass(frozen=True)
class Straggler:
    rank: int
    delay_ns: int
    from_step: int = 0

    @classmethod
    def parse(cls, text: str) -> Straggler:
        """``RANK:MS`` or ``RANK:MS@STEP``."""
        match = re.fullmatch(r"(\d+):(\d+(?:\.\d+)?)(?:@(\d+))?", text.strip())
        if not match:
            raise SimulateError(f"--straggler: {text!r} is not RANK:MS or RANK:MS@STEP (e.g. 517:40 or 517:40@100)")
        rank, ms, step = match.groups()
        return cls(int(rank), int(float(ms) * 1e6), int(step or 0))


@dataclass(frozen=True, kw_only=True)
class Simulation:
    ranks: int
    steps: int
    collectives_per_step: int = 0  # 0: the template's step once; more repeats it, squeezed into the step
    hosts: int = 0  # 0: 8 ranks a host, as on a DGX node
    stragglers: tuple[Straggler, ...] = ()
    name: str = "simulated"
    run_id: str = ""
    seed: int = 0
    template: simulate_template.Template = field(default_factory=simulate_template.load)

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise SimulateError(f"--ranks must be >= 1, got {self.ranks}")
        if self.steps < 1:
            raise SimulateError(f"--steps must be >= 1, got {self.steps}")
        if self.collectives_per_step < 0:
            raise SimulateError(f"--collectives-per-step must be >= 0, got {self.collectives_per_step}")
        if not 0 <= self.hosts <= self.ranks:
            raise SimulateError(f"--hosts must be in [1, --ranks={self.ranks}], got {self.hosts}")
        for s in self.stragglers:
            if not 0 <= s.rank < self.ranks:
                raise SimulateError(f"--straggler: rank {s.rank} is not a rank of a run of {self.ranks}")
            if s.from_step >= self.steps:
                raise SimulateError(f"--straggler: step {s.from_step} is past the last step ({self.steps - 1})")
        if not self.run_id:
            object.__setattr__(self, "run_id", layout.new_run_id(self.name))
        try:
            layout.check_run_id(self.run_id)
        except layout.RunIdError as exc:
            raise SimulateError(f"--run-id: {exc}") from None

    # ---- shape ---------------------------------------------------------------------------
    @property
    def per_step(self) -> int:
        return self.collectives_per_step or len(self.template.collectives)

    @property
    def ranks_per_host(self) -> int:
        hosts = self.hosts or max(1, -(-self.ranks // 8))
        return -(-self.ranks // hosts)

    def host(self, rank: int) -> str:
        return f"node-{rank // self.ranks_per_host:04d}"

    @property
    def step_period_ns(self) -> int:
        # Room for the slowest straggler: a step takes as long as its last rank.
        return self.template.step_period_ns + max((s.delay_ns for s in self.stragglers), default=0)

    @property
    def records_per_rank(self) -> int:
        t = self.template
        return self.steps * (self.per_step + len(t.timers) + len(t.monitor) + len(t.memory))

    def _delay(self, ranks: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """[len(ranks), len(steps)] ns each rank is late at each step."""
        out = np.zeros((len(ranks), len(steps)), dtype=np.int64)
        for s in self.stragglers:
            out += np.where(ranks[:, None] == s.rank, 1, 0) * np.where(steps[None, :] >= s.from_step, s.delay_ns, 0)
        return out

    def _step_delay(self, steps: np.ndarray) -> np.ndarray:
        """ns the slowest rank is late at each step: when every collective of the step can finish."""
        return self._delay(np.array([s.rank for s in self.stragglers], dtype=np.int64), steps).max(axis=0, initial=0)

    # ---- rows ----------------------------------------------------------------------------
    def block(self, first_rank: int, n_ranks: int) -> dict[str, pa.Table]:
        """Every table's rows of ranks [first_rank, first_rank + n_ranks), stored schema."""
        t = self.template
        ranks = np.arange(first_rank, first_rank + n_ranks, dtype=np.int64)
        steps = np.arange(self.steps, dtype=np.int64)
        step_t0 = T0_NS + steps * self.step_period_ns
        late = self._delay(ranks, steps)  # [R, S]
        out = {}

        # comm: [R, S, P]
        pattern = [t.collectives[p % len(t.collectives)] for p in range(self.per_step)]
        repeats = -(-self.per_step // len(t.collectives))
        span = t.collectives[-1].offset_ns + t.collectives[-1].transfer_ns
        offset = np.array(
            [c.offset_ns // repeats + (p // len(t.collectives)) * span // repeats for p, c in enumerate(pattern)]
        )
        transfer = np.array([c.transfer_ns // repeats for c in pattern])
        planned = step_t0[:, None] + t.collective_offset_ns + offset[None, :]  # [S, P]
        index = (steps[:, None] * self.per_step + np.arange(self.per_step)[None, :]).ravel()
        jitter = np.stack([(hash_uniform(self.seed, int(r), index) * JITTER_NS).astype(np.int64) for r in ranks])
        start = planned[None] + late[:, :, None] + jitter.reshape(n_ranks, self.steps, self.per_step)
        end = planned + self._step_delay(steps)[:, None] + JITTER_NS + transfer[None, :]
        end = np.broadcast_to(end[None], start.shape)
        nbytes = np.array([c.bytes for c in pattern])
        algbw = nbytes[None, None, :] / (end - start)  # bytes/ns == GB/s
        factor = np.array([bus_factor(c.op, self.ranks) for c in pattern])
        n = start.size
        per_rank = self.steps * self.per_step

        def tile(values) -> list:
            return [values[p] for p in range(self.per_step)] * (self.steps * n_ranks)

        out["comm"] = _table(
            "comm",
            rank=np.repeat(ranks, per_rank),
            step=np.tile(np.repeat(steps, self.per_step), n_ranks),
            group_name=[GROUP] * n,
            group_size=np.full(n, self.ranks),
            seq=np.tile(index, n_ranks),
            op=tile([c.op for c in pattern]),
            log_name=tile([c.log_name for c in pattern]),
            dtype=tile([c.dtype for c in pattern]),
            numel=np.tile([c.numel for c in pattern], self.steps * n_ranks),
            bytes=np.tile(nbytes, self.steps * n_ranks),
            start_ns=start.ravel(),
            end_ns=end.ravel(),
            async_op=np.tile([c.async_op for c in pattern], self.steps * n_ranks),
            algbw_gbs=algbw.ravel(),
            busbw_gbs=(algbw * factor[None, None, :]).ravel(),
            peer=np.full(n, -1),
        )

        # timers: a straggler's forward pass is the slow part; everything after it shifts
        names = [x.name for x in t.timers]
        dur = np.array([x.dur_ns for x in t.timers])[None, None, :] * _noise(self.seed, ranks, steps, len(names), 0.03)
        dur[:, :, 0] += late
        shift = np.array([x.offset_ns > 0 for x in t.timers])[None, None, :] * late[:, :, None]
        begin = step_t0[None, :, None] + np.array([x.offset_ns for x in t.timers])[None, None, :] + shift
        k = len(names)
        out["timers"] = _table(
            "timers",
            rank=np.repeat(ranks, self.steps * k),
            step=np.tile(np.repeat(steps, k), n_ranks),
            name=names * (self.steps * n_ranks),
            start_ns=begin.astype(np.int64).ravel(),
            dur_ns=dur.astype(np.int64).ravel(),
        )

        # monitor: loss and lr are the run's; throughput is each rank's, lower for a slow rank
        frac = steps / max(1, self.steps - 1)
        values = []
        for tag in t.monitor:
            curve = np.broadcast_to(tag.first + (tag.last - tag.first) * frac, (n_ranks, self.steps))
            if tag.per_rank:
                slow = t.step_period_ns / (t.step_period_ns + late)
                curve = curve * slow * _noise(self.seed, ranks, steps, 1, 0.02)[:, :, 0]
            values.append(curve)
        k = len(t.monitor)
        out["monitor"] = _table(
            "monitor",
            rank=np.repeat(ranks, self.steps * k),
            step=np.tile(np.repeat(steps, k), n_ranks),
            tag=[x.tag for x in t.monitor] * (self.steps * n_ranks),
            value=np.stack(values, axis=2).ravel() if values else np.zeros(0),
            samples=np.tile(np.repeat((steps + 1) * self.ranks, k), n_ranks),
            time_ns=np.tile(np.repeat(step_t0 + self.step_period_ns, k), n_ranks),
        )

        k = len(t.memory)
        size = np.array([b for _, b in t.memory], dtype=np.float64)[None, None, :]
        out["memory"] = _table(
            "memory",
            rank=np.repeat(ranks, self.steps * k),
            step=np.tile(np.repeat(steps, k), n_ranks),
            kind=[kind for kind, _ in t.memory] * (self.steps * n_ranks),
            bytes=(size * _noise(self.seed, ranks, steps, k, 0.01)).astype(np.int64).ravel(),
            time_ns=np.tile(np.repeat(step_t0, k), n_ranks),
        )
        return out

    def hello(self, rank: int) -> pb.Hello:
        return pb.Hello(
            run_id=self.run_id,
            run_name=self.name,
            rank=rank,
            world_size=self.ranks,
            host=self.host(rank),
            pid=10_000 + rank,
            started_at_ns=T0_NS,
            source="simulate",
            config_json=json.dumps(self.config()),
        )

    def run_end(self, rank: int) -> pb.RunEnd:
        ended = T0_NS + self.steps * self.step_period_ns
        return pb.RunEnd(run_id=self.run_id, rank=rank, status="finished", ended_at_ns=ended)

    def config(self) -> dict:
        """The DeepSpeed config of the engine run the template came from, at this world size."""
        return {
            "train_batch_size": 8 * self.ranks,
            "zero_optimization": {"stage": 2},
            "comms_logger": {"enabled": True},
            "rankscope_simulate": {
                "template": self.template.source_run,
                "stragglers": [vars(s) for s in self.stragglers],
            },
        }

    def client_id(self, rank: int) -> str:
        return f"simulate-{self.run_id}-{rank}"

    def blocks(self) -> Iterator[tuple[range, dict[str, pa.Table]]]:
        for first in range(0, self.ranks, BLOCK_RANKS):
            n = min(BLOCK_RANKS, self.ranks - first)
            yield range(first, first + n), self.block(first, n)

    def rank_envelopes(self, rank: int) -> Iterator[pb.Envelope]:
        """What one rank sends, generated lazily: Hello, its rows of every table, RunEnd."""
        client = self.client_id(rank)
        yield envelope(client, 1, hello=self.hello(rank))
        seq = 2
        for table, rows in self.block(rank, 1).items():
            for batch in table_batches(table, self.run_id, rank, rows):
                yield envelope(client, seq, table=batch)
                seq += 1
        yield envelope(client, seq, end=self.run_end(rank))


def _table(table: str, /, **columns) -> pa.Table:
    schema = TABLES[table].arrow_schema()
    n = len(columns["step"])
    arrays = [pa.nulls(n, f.type) if columns.get(f.name) is None else pa.array(columns[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def hash_uniform(seed: int, rank: int, index: np.ndarray) -> np.ndarray:
    """Floats in [0, 1), a hash of (seed, rank, index): the same however the run is cut into blocks."""
    with np.errstate(over="ignore"):
        x = index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x ^= np.uint64((seed * 0x100000001B3 + rank * 0xBF58476D1CE4E5B9 + 1) % (1 << 64))
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _noise(seed: int, ranks: np.ndarray, steps: np.ndarray, k: int, spread: float) -> np.ndarray:
    """[R, S, k] factors in [1 - spread, 1 + spread], a function of (seed, rank, step, k)."""
    index = (steps[:, None] * k + np.arange(k)[None, :]).ravel() + (1 << 40)  # apart from the comm jitter's
    u = np.stack([hash_uniform(seed, int(r), index) for r in ranks]).reshape(len(ranks), len(steps), k)
    return 1 + spread * (2 * u - 1)


# ---- delivery ----------------------------------------------------------------------------


def write_data_dir(sim: Simulation, data_dir, progress=None) -> int:
    """Write ``sim`` into ``data_dir`` through the collector's Store; returns the records written."""
    from collector.server.store import Store  # the server side: only this delivery needs it

    catalog.ensure_catalog(data_dir)
    store = Store(data_dir)
    errors: list[BaseException] = []
    written = 0
    try:
        for ranks, tables in sim.blocks():
            rows = []
            for r in ranks:
                rows += envelope_rows(envelope(sim.client_id(r), 1, hello=sim.hello(r)))
                rows += envelope_rows(envelope(sim.client_id(r), 2, end=sim.run_end(r)))
            rows += [(table, sim.run_id, t) for table, t in tables.items()]
            store.submit(f"simulate-{sim.run_id}-block{ranks.start}", 1, rows, lambda e: e and errors.append(e))
            written += sum(t.num_rows for t in tables.values())
            if progress:
                progress(ranks.stop, written)
        store.flush()
    finally:
        store.close()
    if errors:
        raise SimulateError(f"writing {data_dir} failed: {errors[0]}")
    catalog.ensure_catalog(data_dir)
    return written


def stream(sim: Simulation, endpoint: str, *, token: str | None = None, streams: int = 128, progress=None) -> int:
    """Send ``sim`` through the collector at ``endpoint``: one stream per rank, ``streams`` at a
    time over one channel; returns the envelopes acknowledged (durable)."""
    acked = 0
    with GrpcSink(endpoint, token=token) as sink:
        for first in range(0, sim.ranks, streams):
            wave = range(first, min(sim.ranks, first + streams))
            acked += sink.send(sim.rank_envelopes(r) for r in wave)
            if progress:
                progress(wave.stop, None)
    return acked


def main(args: argparse.Namespace) -> int:
    try:
        if args.hang is not None:
            raise SimulateError("--hang needs the in-flight collective tables, which this collector does not store yet")
        if args.streams < 1:
            raise SimulateError(f"--streams must be >= 1, got {args.streams}")
        sim = Simulation(
            ranks=args.ranks,
            steps=args.steps,
            collectives_per_step=args.collectives_per_step,
            hosts=args.hosts,
            stragglers=tuple(Straggler.parse(s) for s in args.straggler),
            name=args.name,
            seed=args.seed,
        )
    except SimulateError as exc:
        print(f"rankscope simulate: {exc}", file=sys.stderr)
        return 2
    total = sim.records_per_rank * sim.ranks
    began = time.monotonic()
    where = args.endpoint or args.data_dir
    print(f"simulating {sim.run_id}: {sim.ranks} ranks x {sim.steps} steps, {total:,} records -> {where}", flush=True)
    last = [began]

    def progress(done_ranks: int, _records) -> None:
        now = time.monotonic()
        if now - last[0] >= 2 or done_ranks == sim.ranks:
            last[0] = now
            print(f"  {done_ranks}/{sim.ranks} ranks ({now - began:.1f} s)", flush=True)

    try:
        if args.endpoint:
            stream(sim, args.endpoint, token=args.token, streams=args.streams, progress=progress)
        else:
            write_data_dir(sim, args.data_dir, progress=progress)
    except (SinkError, SimulateError, OSError) as exc:
        print(f"rankscope simulate: {exc}", file=sys.stderr)
        return 1
    took = time.monotonic() - began
    print(f"done: run {sim.run_id} ({sim.name}), {total:,} records in {took:.1f} s ({total / took:,.0f}/s)")
    return 0
