"""``rankscope simulate``: a synthetic run of thousands of ranks, to try the dashboard at
scale and to load-test a collector.

Every rank repeats a real engine step (collector/tools/simulate_template.py: the ZeRO-2 sample run's
collectives, timers, monitor tags and memory kinds), on a "world" group of all ranks, with a few
hundred microseconds of per-rank jitter. ``--straggler RANK:MS[@STEP]`` makes one rank's forward
pass MS slower from STEP on, so it enters the step's first collective MS late and everyone else
waits for it there; the rest of the step runs MS later on every rank -- the story ``rankscope
health`` and the Stragglers page must tell. ``--hang RANK:STEP`` makes RANK stop before the first
collective of STEP (a stall in Python, say a data loader that never returns) while every other rank
enters it and waits: the run is a snapshot ``hang_after_s`` + ``HANG_SEEN_S`` into the hang, with
what real ranks send while hung (collector.rank.watchdog): a heartbeat a second from every rank, the
waiting ranks' ``inflight`` reports, their stacks captured at ``hang_after_s``, the stuck rank's
stack as the collector's request for it gets answered, and no RunEnd. Its clock is anchored so that
the snapshot is *now*: the hang is current when it is written, as ``rankscope health`` and the
Liveness page judge it; a while later the frozen heartbeats read as silent ranks too, which is what
a job frozen since looks like. (Streamed, the ranks' streams close without RunEnd, so the collector
also reports them stopped, as for a hung job killed.)

``--slow-link HOST:FACTOR@STEP[-END]`` (implies ``--host-groups``) makes HOST's link FACTOR times
slower in steps STEP to END-1 (END: when it is restored; without, to the end). ``--host-groups``
adds, after the template's collectives, what a run over several hosts also does each step: a 4 MiB
all_reduce inside each host (group ``host<h>``) and one with the same local rank on each
neighbouring host (``pair<h>.<l>``: hosts h and h+1, a ring over the hosts; as pipeline stages
exchange). A slow link stretches the transfer of the pairs through it and of the collectives over
every host (a ring is as fast as its slowest link), not those inside hosts: the story
``rankscope health`` must localise to that host (collector/data/findings/links.py).

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
import dataclasses
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collector.data import catalog, layout
from collector.data.bandwidth import bus_factor
from collector.data.codec import envelope_rows
from collector.data.schema import TABLES, rank_ranges
from collector.tools import simulate_template
from collector.tools.importers.sink import GrpcSink, SinkError, envelope, table_batches
from proto import pb

GROUP = "world"
JITTER_NS = 300_000  # each rank enters a collective up to this much after its planned time
BLOCK_RANKS = 64  # ranks generated (and submitted) together
T0_NS = 1_795_000_000_000_000_000  # 2026-11-19: a fixed start, so a simulation is reproducible
HEARTBEAT_NS = 1_000_000_000  # the ranks' default heartbeat period
REPORT_AFTER_NS = 500_000_000  # a collective in flight this long is reported (collector.rank.watchdog)
HANG_SEEN_S = 5.0  # a --hang run ends this long after the waiting ranks crossed hang_after_s
# --host-groups: the collectives inside a host and between neighbouring hosts, each step
HOST_GROUP_BYTES = 4 << 20
INTRA_TRANSFER_NS = 2_000_000
PAIR_TRANSFER_NS = 4_000_000


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


@dataclass(frozen=True)
class Hang:
    rank: int
    step: int

    @classmethod
    def parse(cls, text: str) -> Hang:
        """``RANK:STEP``."""
        match = re.fullmatch(r"(\d+):(\d+)", text.strip())
        if not match:
            raise SimulateError(f"--hang: {text!r} is not RANK:STEP (e.g. 517:120)")
        return cls(int(match[1]), int(match[2]))


@dataclass(frozen=True)
class SlowLink:
    host: int
    factor: float
    from_step: int
    to_step: int | None = None  # the step it is at speed again (None: never)

    @classmethod
    def parse(cls, text: str) -> SlowLink:
        """``HOST:FACTOR@STEP[-END]``; HOST a host index or its name (``node-0003``)."""
        match = re.fullmatch(r"(?:node-)?(\d+):(\d+(?:\.\d+)?)@(\d+)(?:-(\d+))?", text.strip())
        if not match:
            raise SimulateError(
                f"--slow-link: {text!r} is not HOST:FACTOR@STEP[-END] (e.g. 17:4@100-200 or node-0017:4@100)"
            )
        host, factor, first, end = match.groups()
        link = cls(int(host), float(factor), int(first), int(end) if end else None)
        if link.factor < 1:
            raise SimulateError(f"--slow-link: factor {factor} must be >= 1 (how many times slower)")
        if link.to_step is not None and link.to_step <= link.from_step:
            raise SimulateError(f"--slow-link: END {end} must be after STEP {first}")
        return link

    def on(self, steps: np.ndarray) -> np.ndarray:
        return (steps >= self.from_step) & (steps < (self.to_step if self.to_step is not None else np.inf))


@dataclass(frozen=True, kw_only=True)
class Simulation:
    ranks: int
    steps: int
    collectives_per_step: int = 0  # 0: the template's step once; more repeats it, squeezed into the step
    hosts: int = 0  # 0: 8 ranks a host, as on a DGX node
    stragglers: tuple[Straggler, ...] = ()
    hang: Hang | None = None
    slow_links: tuple[SlowLink, ...] = ()
    host_groups: bool = False  # implied by slow_links
    hang_after_s: float = 60.0  # the ranks' setting (rankscope's default)
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
        if self.slow_links:
            object.__setattr__(self, "host_groups", True)
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

    # ---- --host-groups -------------------------------------------------------------------
    @property
    def _pair_slot_ns(self) -> int:
        slowest = max((link.factor for link in self.slow_links), default=1.0)
        return int(PAIR_TRANSFER_NS * slowest) + 2 * JITTER_NS

    @property
    def _host_groups_at_ns(self) -> int:
        """When a step's host-group collectives begin, after the template's last one ends."""
        last = self.template.collectives[-1]
        return self.template.collective_offset_ns + last.offset_ns + last.transfer_ns + JITTER_NS

    @property
    def host_groups_ns(self) -> int:
        """What the host-group collectives add to a step: the intra-host one, three pair slots."""
        return INTRA_TRANSFER_NS + 2 * JITTER_NS + 3 * self._pair_slot_ns if self.host_groups else 0

    def _pair_slot(self, pair: int) -> int:
        """Pairs a rank is in never share a slot: even pairs first, then odd, then the pair that
        closes an odd ring of hosts."""
        return 2 if self.n_hosts % 2 and pair == self.n_hosts - 1 else pair % 2

    def _link_factor(self, hosts: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """[len(hosts), len(steps)]: how many times slower each host's link is at each step."""
        out = np.ones((len(hosts), len(steps)))
        for link in self.slow_links:
            out *= np.where((hosts[:, None] == link.host) & link.on(steps)[None, :], link.factor, 1.0)
        return out

    def _host_group_comm(self, ranks: np.ndarray, steps: np.ndarray, step_start: np.ndarray) -> pa.Table:
        """The comm rows of --host-groups for ``ranks``: per step, the all_reduce inside the rank's
        host, then one with each neighbouring host (the pairs (h-1, h) and (h, h+1) of its local rank)."""
        per, n_hosts = self.ranks_per_host, self.n_hosts
        host, local = ranks // per, ranks % per
        pairs = np.stack([(host - 1) % n_hosts, host], axis=1)  # [R, 2]: pair p joins hosts p and p+1
        slots = np.vectorize(self._pair_slot)(pairs)
        # a pair's transfer: its slower host's link decides
        factor = np.stack(
            [np.maximum(self._link_factor(p, steps), self._link_factor((p + 1) % n_hosts, steps)) for p in pairs.T],
            axis=1,
        )  # [R, 2, S]
        at = step_start[None, :] + self._host_groups_at_ns  # [1, S]
        pair_at = at + INTRA_TRANSFER_NS + 2 * JITTER_NS
        planned = np.concatenate(
            [
                np.broadcast_to(at, (len(ranks), len(steps)))[:, :, None],
                (pair_at[:, :, None] + slots[:, None, :] * self._pair_slot_ns),
            ],
            axis=2,
        )  # fmt: skip  [R, S, 3]
        transfer = np.concatenate(
            [np.full((len(ranks), len(steps), 1), INTRA_TRANSFER_NS), PAIR_TRANSFER_NS * factor.transpose(0, 2, 1)],
            axis=2,
        )
        index = steps[None, :, None] * 3 + np.arange(3)[None, None, :] + (1 << 42)
        jitter = np.stack([hash_uniform(self.seed, int(r), index.ravel()) for r in ranks]).reshape(planned.shape)
        start = planned + (jitter * JITTER_NS).astype(np.int64)
        end = planned + JITTER_NS + transfer.astype(np.int64)
        groups = np.stack(
            [np.char.add("host", host.astype(str))]
            + [np.char.add(np.char.add(np.char.add("pair", p.astype(str)), "."), local.astype(str)) for p in pairs.T],
            axis=1,
        )  # [R, 3]
        sizes = np.array([per, 2, 2])
        n = start.size
        algbw = HOST_GROUP_BYTES / (end - start)
        busbw = algbw * np.array([bus_factor("all_reduce", int(x)) for x in sizes])[None, None, :]
        return _table(
            "comm",
            rank=np.repeat(ranks, len(steps) * 3),
            step=np.tile(np.repeat(steps, 3), len(ranks)),
            group_name=np.repeat(groups[:, None, :], len(steps), axis=1).ravel().tolist(),
            group_size=np.tile(sizes, len(ranks) * len(steps)),
            seq=np.tile(np.repeat(steps, 3), len(ranks)),
            op=["all_reduce"] * n,
            log_name=["host_groups.all_reduce"] * n,
            dtype=["float32"] * n,
            numel=np.full(n, HOST_GROUP_BYTES // 4),
            bytes=np.full(n, HOST_GROUP_BYTES),
            start_ns=start.ravel(),
            end_ns=end.ravel(),
            async_op=np.zeros(n, dtype=bool),
            algbw_gbs=algbw.ravel(),
            busbw_gbs=busbw.ravel(),
            peer=np.full(n, -1),
        )

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
            return self.start_ns + self.steps * self.step_period_ns
        # every waiting rank entered by the step's planned first collective + the slowest's lateness + jitter
        t = self.template
        hang_step = np.array([self.hang.step], dtype=np.int64)
        entered = self.hang.step * self.step_period_ns + t.collective_offset_ns + int(self._step_delay(hang_step)[0])
        return self.start_ns + entered + JITTER_NS + int((self.hang_after_s + HANG_SEEN_S) * 1e9)

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
        step_t0 = self.start_ns + steps * self.step_period_ns
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
        # A slow forward pass makes its rank late to the step's first collective only: everyone
        # waits for it there, and from then on the whole step runs that much later on every rank
        # (nobody waits again), so the step costs the delay once, as on real ranks.
        step_delay = self._step_delay(steps)
        first = (np.arange(self.per_step) == 0)[None, None, :]
        behind = np.where(first, late[:, :, None], step_delay[None, :, None])
        start = planned[None] + behind + jitter.reshape(n_ranks, self.steps, self.per_step)
        # a ring over every host runs at its slowest link's speed
        slowest = self._link_factor(np.arange(self.n_hosts), steps).max(axis=0)  # [S]
        end = planned + step_delay[:, None] + JITTER_NS + (transfer[None, :] * slowest[:, None]).astype(np.int64)
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
        if self.host_groups:
            extra = self._host_group_comm(ranks, steps, step_t0 + self._step_delay(steps))
            out["comm"] = pa.concat_tables([out["comm"], extra])

        # timers: a straggler's forward pass is the slow part; everything after it shifts
        names = [x.name for x in t.timers]
        dur = np.array([x.dur_ns for x in t.timers])[None, None, :] * _noise(self.seed, ranks, steps, len(names), 0.03)
        dur[:, :, 0] += late
        dur[:, :, -1] += self.host_groups_ns  # the optimizer step waits for the host-group collectives
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
        if self.hang is not None:
            out = {table: rows.filter(pc.less(rows["step"], self.hang.step)) for table, rows in out.items()}
            out.update(self._hang_rows(ranks, start[:, self.hang.step, 0], pattern[0]))
        return out

    def _hang_rows(self, ranks: np.ndarray, entered: np.ndarray, hung_in) -> dict[str, pa.Table]:
        """What ranks send while one of them is stuck: heartbeats from all, ``inflight`` reports and
        stacks from those waiting in the hang's collective (``entered``: when each rank entered it),
        and the stuck rank's stack answering the collector's request."""
        hang, until = self.hang, self.end_ns
        hang_after_ns = int(self.hang_after_s * 1e9)
        members = rank_ranges(range(self.ranks))
        beats = {"rank": [], "step": [], "time_ns": [], "inflight": []}
        reports = {"rank": [], "time_ns": [], "entered_ns": []}
        stacks = {"rank": [], "time_ns": [], "reason": [], "stack": [], "innermost": []}
        phase = (hash_uniform(self.seed, 0, ranks + (1 << 41)) * HEARTBEAT_NS).astype(np.int64)
        for r, since, offset in zip(ranks.tolist(), entered.tolist(), phase.tolist()):
            times = np.arange(self.start_ns + offset, until, HEARTBEAT_NS, dtype=np.int64)
            waiting = r != hang.rank
            reported = times[times >= since + REPORT_AFTER_NS] if waiting else times[:0]
            beats["rank"] += [r] * len(times)
            beats["step"] += np.minimum(hang.step, (times - self.start_ns) // self.step_period_ns).tolist()
            beats["time_ns"] += times.tolist()
            beats["inflight"] += (
                (times >= since + REPORT_AFTER_NS).astype(np.int64).tolist() if waiting else [0] * len(times)
            )
            reports["rank"] += [r] * len(reported)
            reports["time_ns"] += reported.tolist()
            reports["entered_ns"] += [since] * len(reported)
            if waiting:
                at = since + hang_after_ns
                reason = f"hang: {hung_in.op} {GROUP} #{self.hang_seq} in flight > {self.hang_after_s:g} s"
                frames = [("train.py", 31, "main"), ("engine.py", 212, "backward"), ("engine.py", 240, hung_in.op)]
            else:
                at = until - int(HANG_SEEN_S * 1e9) + HEARTBEAT_NS  # asked once the hang was seen, answered
                reason = f"missing from {hung_in.op} #{self.hang_seq} of {GROUP}"
                frames = [
                    ("train.py", 31, "main"),
                    ("train.py", 57, "next_batch"),
                    ("loader.py", 88, "simulated_stall"),
                ]
            stacks["rank"].append(r)
            stacks["time_ns"].append(at)
            stacks["reason"].append(reason)
            stacks["stack"].append("".join(f'  File "{f}", line {line}, in {fn}\n' for f, line, fn in frames))
            stacks["innermost"].append(f"{frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}")
        n_beats, n_reports, n_stacks = len(beats["rank"]), len(reports["rank"]), len(stacks["rank"])
        return {
            "heartbeats": _table(
                "heartbeats",
                **beats,
                period_s=np.full(n_beats, HEARTBEAT_NS / 1e9),
                hang_after_s=np.full(n_beats, self.hang_after_s),
                ending=np.zeros(n_beats, dtype=bool),
            ),
            "inflight": _table(
                "inflight",
                **reports,
                step=np.full(n_reports, hang.step),
                group_name=[GROUP] * n_reports,
                group_size=np.full(n_reports, self.ranks),
                group_ranks=[members] * n_reports,
                seq=np.full(n_reports, self.hang_seq),
                op=[hung_in.op] * n_reports,
                dtype=[hung_in.dtype] * n_reports,
                numel=np.full(n_reports, hung_in.numel),
                bytes=np.full(n_reports, hung_in.bytes),
                hang_after_s=np.full(n_reports, self.hang_after_s),
                state=["waiting"] * n_reports,
            ),
            "stacks": _table(
                "stacks",
                **stacks,
                step=np.full(n_stacks, hang.step),
                thread_name=["MainThread"] * n_stacks,
                thread_id=np.full(n_stacks, 1),
                is_main=np.ones(n_stacks, dtype=bool),
            ),
        }

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


def write_data_dir(sim: Simulation, data_dir, progress=None, *, rollups: bool = True) -> int:
    """Write ``sim`` into ``data_dir`` through the collector's Store; returns the records written.
    ``rollups``: then store what a collector's compaction would have by the end (per-step rollups
    and step analysis of the settled steps, small segments merged), as a recorded run has them."""
    # the server side: only this delivery needs it
    from collector.server.compaction import Compactor
    from collector.server.store import Store

    catalog.ensure_catalog(data_dir)
    store = Store(data_dir)
    errors: list[BaseException] = []
    written = 0
    try:
        for ranks, tables in sim.blocks():
            rows = []
            for r in ranks:
                rows += envelope_rows(envelope(sim.client_id(r), 1, hello=sim.hello(r)))
                if sim.hang is None:
                    rows += envelope_rows(envelope(sim.client_id(r), 2, end=sim.run_end(r)))
            rows += [(table, sim.run_id, t) for table, t in tables.items()]
            store.submit(f"simulate-{sim.run_id}-block{ranks.start}", 1, rows, lambda e: e and errors.append(e))
            written += sum(t.num_rows for t in tables.values())
            if progress:
                progress(ranks.stop, written)
        store.flush()
        if rollups:
            if progress:
                progress(sim.ranks, written, note="storing per-step rollups and step analysis, as a collector does")
            Compactor(data_dir, store.ledger).catch_up()
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
        if args.streams < 1:
            raise SimulateError(f"--streams must be >= 1, got {args.streams}")
        sim = Simulation(
            ranks=args.ranks,
            steps=args.steps,
            collectives_per_step=args.collectives_per_step,
            hosts=args.hosts,
            stragglers=tuple(Straggler.parse(s) for s in args.straggler),
            hang=Hang.parse(args.hang) if args.hang is not None else None,
            slow_links=tuple(SlowLink.parse(x) for x in args.slow_link),
            host_groups=args.host_groups,
            name=args.name,
            seed=args.seed,
        )
        if sim.hang is not None:
            sim = sim.anchored_now()
    except SimulateError as exc:
        print(f"rankscope simulate: {exc}", file=sys.stderr)
        return 2
    total = sim.records_per_rank * sim.ranks
    began = time.monotonic()
    where = args.endpoint or args.data_dir
    hang = f", rank {sim.hang.rank} hung at step {sim.hang.step}" if sim.hang else ""
    print(
        f"simulating {sim.run_id}: {sim.ranks} ranks x {sim.steps} steps{hang}, {total:,} records -> {where}",
        flush=True,
    )
    last = [began]

    def progress(done_ranks: int, _records, note: str = "") -> None:
        now = time.monotonic()
        if note:
            print(f"  {note} ({now - began:.1f} s)", flush=True)
        elif now - last[0] >= 2 or done_ranks == sim.ranks:
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
