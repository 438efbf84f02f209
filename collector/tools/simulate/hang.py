"""``--hang``: what the ranks send while one of them is stuck (collector.rank.watchdog):
a heartbeat a second from every rank, ``inflight`` reports and stacks from those waiting in the
hang's collective, and the stuck rank's stack as the collector's request for it gets answered."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa

from collector.data.schema import rank_ranges
from collector.tools.simulate.faults import Hang
from collector.tools.simulate.rows import GROUP, hash_uniform, stored_table


class HungRun(Protocol):
    """What the hang's rows are made from: a Simulation is one (this module does not import it,
    which imports this one)."""

    ranks: int
    seed: int
    hang: Hang | None
    hang_after_s: float
    start_ns: int

    @property
    def end_ns(self) -> int: ...

    @property
    def hang_seq(self) -> int: ...

    def step_starts(self, steps: np.ndarray) -> np.ndarray: ...


HEARTBEAT_NS = 1_000_000_000  # the ranks' default heartbeat period
REPORT_AFTER_NS = 500_000_000  # a collective in flight this long is reported (collector.rank.watchdog)
HANG_SEEN_S = 5.0  # a --hang run ends this long after the waiting ranks crossed hang_after_s


def hang_rows(sim: HungRun, ranks: np.ndarray, entered: np.ndarray, hung_in) -> dict[str, pa.Table]:
    """What ranks send while one of them is stuck: heartbeats from all, ``inflight`` reports and
    stacks from those waiting in the hang's collective (``entered``: when each rank entered it),
    and the stuck rank's stack answering the collector's request."""
    hang, until = sim.hang, sim.end_ns
    hang_after_ns = int(sim.hang_after_s * 1e9)
    members = rank_ranges(range(sim.ranks))
    beats = {"rank": [], "step": [], "time_ns": [], "inflight": []}
    reports = {"rank": [], "time_ns": [], "entered_ns": []}
    stacks = {"rank": [], "time_ns": [], "reason": [], "stack": [], "innermost": []}
    starts = sim.step_starts(np.arange(hang.step + 1))
    phase = (hash_uniform(sim.seed, 0, ranks + (1 << 41)) * HEARTBEAT_NS).astype(np.int64)
    for r, since, offset in zip(ranks.tolist(), entered.tolist(), phase.tolist()):
        times = np.arange(sim.start_ns + offset, until, HEARTBEAT_NS, dtype=np.int64)
        waiting = r != hang.rank
        reported = times[times >= since + REPORT_AFTER_NS] if waiting else times[:0]
        beats["rank"] += [r] * len(times)
        beats["step"] += np.minimum(hang.step, np.searchsorted(starts, times, side="right") - 1).tolist()
        beats["time_ns"] += times.tolist()
        beats["inflight"] += (
            (times >= since + REPORT_AFTER_NS).astype(np.int64).tolist() if waiting else [0] * len(times)
        )
        reports["rank"] += [r] * len(reported)
        reports["time_ns"] += reported.tolist()
        reports["entered_ns"] += [since] * len(reported)
        if waiting:
            at = since + hang_after_ns
            reason = f"hang: {hung_in.op} {GROUP} #{sim.hang_seq} in flight > {sim.hang_after_s:g} s"
            frames = [("train.py", 31, "main"), ("engine.py", 212, "backward"), ("engine.py", 240, hung_in.op)]
        else:
            at = until - int(HANG_SEEN_S * 1e9) + HEARTBEAT_NS  # asked once the hang was seen, answered
            reason = f"missing from {hung_in.op} #{sim.hang_seq} of {GROUP}"
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
        "heartbeats": stored_table(
            "heartbeats",
            **beats,
            period_s=np.full(n_beats, HEARTBEAT_NS / 1e9),
            hang_after_s=np.full(n_beats, sim.hang_after_s),
            ending=np.zeros(n_beats, dtype=bool),
        ),
        "inflight": stored_table(
            "inflight",
            **reports,
            step=np.full(n_reports, hang.step),
            group_name=[GROUP] * n_reports,
            group_size=np.full(n_reports, sim.ranks),
            group_ranks=[members] * n_reports,
            seq=np.full(n_reports, sim.hang_seq),
            op=[hung_in.op] * n_reports,
            dtype=[hung_in.dtype] * n_reports,
            numel=np.full(n_reports, hung_in.numel),
            bytes=np.full(n_reports, hung_in.bytes),
            hang_after_s=np.full(n_reports, sim.hang_after_s),
            state=["waiting"] * n_reports,
        ),
        "stacks": stored_table(
            "stacks",
            **stacks,
            step=np.full(n_stacks, hang.step),
            thread_name=["MainThread"] * n_stacks,
            thread_id=np.full(n_stacks, 1),
            is_main=np.ones(n_stacks, dtype=bool),
        ),
    }
