"""A simulated run: its shape (ranks, hosts, steps, the template's step) and every table's rows,
generated a block of ranks at a time."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collector.data import hang_rule, layout
from collector.data.bandwidth import bus_factor
from collector.data.queries.steps import COMPUTE_TIMERS
from collector.tools import simulate_template
from collector.tools.importers.sink import envelope, table_batches
from collector.tools.simulate.faults import Hang, SimulateError, SlowLink, Straggler
from collector.tools.simulate.hang import HANG_SEEN_S, hang_rows
from collector.tools.simulate.host_groups import added_step_ns, comm_rows
from collector.tools.simulate.rows import GROUP, JITTER_NS, hash_uniform, noise, stored_table
from collector.tools.simulate.slow_steps import slowest, stretched, transfer_union
from proto import pb

BLOCK_RANKS = 64  # ranks generated (and submitted) together
T0_NS = 1_795_000_000_000_000_000  # 2026-11-19: a fixed start, so a simulation is reproducible


@dataclass(frozen=True, kw_only=True)
class Simulation:
    ranks: int
    steps: int
    collectives_per_step: int = 0  # 0: the template's step once; more repeats it, squeezed into the step
    hosts: int = 0  # 0: 8 ranks a host, as on a DGX node
    stragglers: tuple[Straggler, ...] = ()
    hang: Hang | None = None
    slow_links: tuple[SlowLink, ...] = ()
    host_groups: bool = False  # implied by slow_links, unless world_only
    world_only: bool = False  # the world group alone (plain DDP/FSDP): slow links add no host groups
    telemetry_apart: bool = False  # telemetry takes another network than training: a slow link never delays it
    hang_after_s: float = hang_rule.DEFAULT_HANG_AFTER_S  # the ranks' setting when none is given
    start_ns: int = T0_NS
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
        if self.hang is not None:
            if not 0 <= self.hang.rank < self.ranks:
                raise SimulateError(f"--hang: rank {self.hang.rank} is not a rank of a run of {self.ranks}")
            if self.hang.step >= self.steps:
                raise SimulateError(f"--hang: step {self.hang.step} is past the last step ({self.steps - 1})")
            if self.ranks < 2:
                raise SimulateError("--hang needs --ranks >= 2: someone has to wait for the stuck rank")
        if self.world_only and self.host_groups:
            raise SimulateError("--world-only and --host-groups contradict each other: pick one")
        if self.slow_links and not self.world_only:
            object.__setattr__(self, "host_groups", True)
        if self.slow_links and self.n_hosts < 2:
            raise SimulateError(f"--slow-link needs >= 2 hosts: {self.ranks} ranks on {self.n_hosts} host")
        if self.host_groups:
            if self.n_hosts < 2 or self.ranks_per_host < 2 or self.ranks % self.n_hosts:
                raise SimulateError(
                    f"--host-groups/--slow-link need >= 2 hosts of >= 2 ranks each, all full: "
                    f"{self.ranks} ranks on {self.n_hosts} hosts"
                )
        for link in self.slow_links:
            if not 0 <= link.host < self.n_hosts:
                raise SimulateError(f"--slow-link: host {link.host} is not one of the run's {self.n_hosts} hosts")
            if link.from_step >= self.steps:
                raise SimulateError(f"--slow-link: step {link.from_step} is past the last step ({self.steps - 1})")
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

    @property
    def n_hosts(self) -> int:
        return -(-self.ranks // self.ranks_per_host)

    def host(self, rank: int) -> str:
        return f"node-{rank // self.ranks_per_host:04d}"

    @property
    def step_period_ns(self) -> int:
        # Room for the slowest straggler: a step takes as long as its last rank.
        return (
            self.template.step_period_ns + max((s.delay_ns for s in self.stragglers), default=0) + self.host_groups_ns
        )

    @property
    def host_groups_ns(self) -> int:
        """What --host-groups adds to a step (collector/tools/simulate/host_groups.py)."""
        return added_step_ns(self)

    @property
    def steps_run(self) -> int:
        """Steps every rank completes: all of them, or those before the hang."""
        return self.steps if self.hang is None else self.hang.step

    @property
    def records_per_rank(self) -> int:
        """comm, timers, monitor and memory rows of one rank (a hang's liveness rows come on top)."""
        t = self.template
        per_step = self.per_step + 3 * self.host_groups
        return self.steps_run * (per_step + len(t.timers) + len(t.monitor) + len(t.memory))

    @property
    def hang_seq(self) -> int:
        """The seq (in the world group) of the collective the stuck rank never enters."""
        return self.hang.step * self.per_step

    @property
    def end_ns(self) -> int:
        """When the run ends: its last step done, or (with a hang) the snapshot's time."""
        if self.hang is None:
            return int(self.step_starts(np.array([self.steps]))[0])
        # every waiting rank entered by the step's planned first collective + the slowest's lateness + jitter
        t = self.template
        hang_step = np.array([self.hang.step], dtype=np.int64)
        entered = int(self.step_starts(hang_step)[0]) + t.collective_offset_ns + int(self._step_delay(hang_step)[0])
        return entered + JITTER_NS + int((self.hang_after_s + HANG_SEEN_S) * 1e9)

    def step_starts(self, steps: np.ndarray) -> np.ndarray:
        """When each of ``steps`` begins (a step may be ``steps``: the end of the last): the steps
        before it took the period each, and the transfers a slow link stretched on top
        (collector/tools/simulate/slow_steps.py)."""
        steps = np.asarray(steps, dtype=np.int64)
        every = np.arange(int(steps.max(initial=0)) + 1, dtype=np.int64)
        longer = (slowest(self, every) - 1.0) * self._union_ns
        before = np.concatenate([[0.0], np.cumsum(longer)])[steps]
        return self.start_ns + steps * self.step_period_ns + before.astype(np.int64)

    @property
    def _union_ns(self) -> int:
        """How long a step's collectives move data, their transfers as a union."""
        union = transfer_union(*self._pattern_times())
        return int((union[:, 1] - union[:, 0]).sum())

    def _pattern_times(self) -> tuple[np.ndarray, np.ndarray]:
        """The step's collectives' (offset, transfer), ns from the step's collective offset: the
        template's step, its pattern repeated and squeezed into the same span for more collectives."""
        t = self.template
        pattern = [t.collectives[p % len(t.collectives)] for p in range(self.per_step)]
        repeats = -(-self.per_step // len(t.collectives))
        span = t.collectives[-1].offset_ns + t.collectives[-1].transfer_ns
        offset = np.array(
            [c.offset_ns // repeats + (p // len(t.collectives)) * span // repeats for p, c in enumerate(pattern)],
            dtype=np.int64,
        )
        return offset, np.array([c.transfer_ns // repeats for c in pattern], dtype=np.int64)

    def anchored_now(self) -> Simulation:
        """The same run, its clock shifted so that it ends now (a hang is then current)."""
        return dataclasses.replace(self, start_ns=self.start_ns + time.time_ns() - self.end_ns)

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
        step_t0 = self.step_starts(steps)
        next_t0 = self.step_starts(steps + 1)
        late = self._delay(ranks, steps)  # [R, S]
        out = {}

        # comm: [R, S, P]; a slow link stretches the step's time line where its collectives move data
        pattern = [t.collectives[p % len(t.collectives)] for p in range(self.per_step)]
        offset, transfer = self._pattern_times()
        union = transfer_union(offset, transfer)
        ring = slowest(self, steps)[:, None]  # [S, 1]: a ring over every host runs at its slowest link's speed
        planned = step_t0[:, None] + t.collective_offset_ns + stretched(union, offset[None, :], ring)  # [S, P]
        index = (steps[:, None] * self.per_step + np.arange(self.per_step)[None, :]).ravel()
        jitter = np.stack([(hash_uniform(self.seed, int(r), index) * JITTER_NS).astype(np.int64) for r in ranks])
        # A slow forward pass makes its rank late to the step's first collective only: everyone
        # waits for it there, and from then on the whole step runs that much later on every rank
        # (nobody waits again), so the step costs the delay once, as on real ranks.
        step_delay = self._step_delay(steps)
        first = (np.arange(self.per_step) == 0)[None, None, :]
        behind = np.where(first, late[:, :, None], step_delay[None, :, None])
        start = planned[None] + behind + jitter.reshape(n_ranks, self.steps, self.per_step)
        done = step_t0[:, None] + t.collective_offset_ns + stretched(union, (offset + transfer)[None, :], ring)
        end = done + step_delay[:, None] + JITTER_NS
        end = np.broadcast_to(end[None], start.shape)
        nbytes = np.array([c.bytes for c in pattern])
        algbw = nbytes[None, None, :] / (end - start)  # bytes/ns == GB/s
        factor = np.array([bus_factor(c.op, self.ranks) for c in pattern])
        n = start.size
        per_rank = self.steps * self.per_step

        def tile(values) -> list:
            return [values[p] for p in range(self.per_step)] * (self.steps * n_ranks)

        out["comm"] = stored_table(
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
        longer = next_t0 - step_t0 - self.step_period_ns  # [S]: what the stretched transfers added to the step
        if self.host_groups:
            extra = comm_rows(self, ranks, steps, step_t0 + self._step_delay(steps) + longer)
            out["comm"] = pa.concat_tables([out["comm"], extra])

        # timers: a straggler's forward pass is the slow part; everything after it shifts. A slow
        # link stretches what waited for data (their ends move with the time line) and moves
        # compute that did not (fwd, bwd_inner: their durations stay)
        names = [x.name for x in t.timers]
        base = np.array([x.dur_ns for x in t.timers])
        at = np.array([x.offset_ns for x in t.timers]) - t.collective_offset_ns  # on the collectives' time line
        begins = stretched(union, at[None, :], ring)  # [S, k]
        grew = stretched(union, (at + base)[None, :], ring) - begins - base[None, :]
        waits = np.array([x.name not in COMPUTE_TIMERS for x in t.timers])[None, :]
        dur = base[None, None, :] * noise(self.seed, ranks, steps, len(names), 0.03) + (grew * waits)[None]
        dur[:, :, 0] += late
        dur[:, :, -1] += self.host_groups_ns  # the optimizer step waits for the host-group collectives
        shift = np.array([x.offset_ns > 0 for x in t.timers])[None, None, :] * late[:, :, None]
        begin = step_t0[None, :, None] + t.collective_offset_ns + begins[None] + shift
        k = len(names)
        out["timers"] = stored_table(
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
                curve = curve * slow * noise(self.seed, ranks, steps, 1, 0.02)[:, :, 0]
            values.append(curve)
        k = len(t.monitor)
        out["monitor"] = stored_table(
            "monitor",
            rank=np.repeat(ranks, self.steps * k),
            step=np.tile(np.repeat(steps, k), n_ranks),
            tag=[x.tag for x in t.monitor] * (self.steps * n_ranks),
            value=np.stack(values, axis=2).ravel() if values else np.zeros(0),
            samples=np.tile(np.repeat((steps + 1) * self.ranks, k), n_ranks),
            time_ns=np.tile(np.repeat(next_t0, k), n_ranks),
        )

        k = len(t.memory)
        size = np.array([b for _, b in t.memory], dtype=np.float64)[None, None, :]
        out["memory"] = stored_table(
            "memory",
            rank=np.repeat(ranks, self.steps * k),
            step=np.tile(np.repeat(steps, k), n_ranks),
            kind=[kind for kind, _ in t.memory] * (self.steps * n_ranks),
            bytes=(size * noise(self.seed, ranks, steps, k, 0.01)).astype(np.int64).ravel(),
            time_ns=np.tile(np.repeat(step_t0, k), n_ranks),
        )
        if self.hang is not None:
            out = {table: rows.filter(pc.less(rows["step"], self.hang.step)) for table, rows in out.items()}
            out.update(hang_rows(self, ranks, start[:, self.hang.step, 0], pattern[0]))
        return out

    def hello(self, rank: int) -> pb.Hello:
        return pb.Hello(
            run_id=self.run_id,
            run_name=self.name,
            rank=rank,
            world_size=self.ranks,
            host=self.host(rank),
            pid=10_000 + rank,
            started_at_ns=self.start_ns,
            source="simulate",
            config_json=json.dumps(self.config()),
        )

    def run_end(self, rank: int) -> pb.RunEnd:
        return pb.RunEnd(run_id=self.run_id, rank=rank, status="finished", ended_at_ns=self.end_ns)

    def config(self) -> dict:
        """The DeepSpeed config of the engine run the template came from, at this world size."""
        return {
            "train_batch_size": 8 * self.ranks,
            "zero_optimization": {"stage": 2},
            "comms_logger": {"enabled": True},
            "telemetry": {"hang_after_s": self.hang_after_s},
            "rankscope_simulate": {
                "template": self.template.source_run,
                "stragglers": [vars(s) for s in self.stragglers],
                "hang": vars(self.hang) if self.hang else None,
                "host_groups": self.host_groups,
                "world_only": self.world_only,
                "telemetry_apart": self.telemetry_apart,
                "slow_links": [vars(x) for x in self.slow_links],
            },
        }

    def client_id(self, rank: int) -> str:
        return f"simulate-{self.run_id}-{rank}"

    def blocks(self) -> Iterator[tuple[range, dict[str, pa.Table]]]:
        for first in range(0, self.ranks, BLOCK_RANKS):
            n = min(BLOCK_RANKS, self.ranks - first)
            yield range(first, first + n), self.block(first, n)

    def rank_envelopes(self, rank: int) -> Iterator[pb.Envelope]:
        """What one rank sends, generated lazily: Hello, its rows of every table, RunEnd (none
        while hung)."""
        client = self.client_id(rank)
        yield envelope(client, 1, hello=self.hello(rank))
        seq = 2
        for table, rows in self.block(rank, 1).items():
            for batch in table_batches(table, self.run_id, rank, rows):
                yield envelope(client, seq, table=batch)
                seq += 1
        if self.hang is None:
            yield envelope(client, seq, end=self.run_end(rank))
