"""`rankscope simulate`: the shipped template is the sample run's step, the run it writes has
the shape it claims (counted), an injected straggler is found by `rankscope health` and a
healthy simulation is not, the same run arrives whether written or streamed, and bad
arguments are refused naming the option. ``--hang`` writes what hung ranks send, and
`rankscope health` names the stuck rank, the op and the step, at 1,024 ranks, written or
streamed; without it, no liveness finding.

Split by tier: what needs processes, sockets or seconds is in tests/integration/tools/test_simulate.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from collector.tools import simulate, simulate_template
from collector.tools.simulate import telemetry

SAMPLES = Path(__file__).resolve().parents[3] / "sample_runs"


def test_the_shipped_template_is_the_zero2_sample_runs_step():
    derived = simulate_template.derive(SAMPLES, "zero2-slow-rank3")
    assert derived == simulate_template.load(), "re-derive: python -m collector.tools.simulate_template"
    ops = [c.op for c in derived.collectives]
    assert ops.count("reduce_scatter_tensor") == 3 and ops.count("all_gather_into_tensor") == 3
    assert {t.name for t in derived.timers} >= {"fwd", "bwd", "step"}
    assert {k for k, _ in derived.memory} >= {"params", "grads", "optimizer"}
    assert derived.step_period_ns > sum(t.dur_ns for t in derived.timers if t.name in ("fwd", "bwd", "step")) * 0.9


def test_rows_do_not_depend_on_how_ranks_are_blocked():
    sim = simulate.Simulation(ranks=10, steps=6, stragglers=(simulate.Straggler(7, 30_000_000, 2),), run_id="s")
    whole = sim.block(0, 10)
    for table, rows in whole.items():
        assert rows.slice(7 * rows.num_rows // 10, rows.num_rows // 10).equals(sim.block(7, 1)[table]), table


def test_straggler_arrives_late_from_its_step_and_everyone_finishes_together():
    sim = simulate.Simulation(ranks=16, steps=8, stragglers=(simulate.Straggler.parse("5:40@3"),), run_id="s")
    comm = sim.block(0, 16)["comm"].to_pandas()
    per = comm.groupby(["step", "seq"])
    first = per.start_ns.transform("min")
    mine = comm["rank"] == 5
    lead, steps = (comm.start_ns - first)[mine], comm.step[mine]
    opens = (comm.seq % sim.per_step == 0)[mine]  # the step's first collective
    # late where everyone waits for it (the step's first collective), on time with the others after
    assert (lead[(steps >= 3) & opens] >= 40e6 - simulate.JITTER_NS).all()
    assert (lead[(steps < 3) | ~opens] <= simulate.JITTER_NS).all()
    # from then on the whole step runs 40 ms later on every rank: the delay is paid once a step
    shift = comm[comm.seq % sim.per_step == 1].groupby("step").start_ns.min().diff().dropna()
    assert (shift.loc[3] - shift.loc[2]) == pytest.approx(40e6, abs=simulate.JITTER_NS)
    assert (per.end_ns.nunique() == 1).all() and (comm.end_ns > comm.start_ns).all()
    assert len(comm) == 16 * 8 * 7 and set(comm.group_size) == {16}


def test_a_hang_is_what_hung_ranks_send_whichever_way_ranks_are_blocked():
    sim = simulate.Simulation(ranks=16, steps=6, hang=simulate.Hang.parse("5:3"), hang_after_s=10, run_id="h")
    whole = sim.block(0, 16)
    for table, rows in whole.items():
        assert pa.concat_tables([sim.block(0, 7)[table], sim.block(7, 9)[table]]).equals(rows), table
    comm, inflight = whole["comm"].to_pandas(), whole["inflight"].to_pandas()
    beats, stacks = whole["heartbeats"].to_pandas(), whole["stacks"].to_pandas()
    assert comm.step.max() == 2 and len(comm) == 16 * 3 * 7  # nobody completes anything from step 3 on
    assert set(inflight["rank"]) == set(range(16)) - {5} and set(inflight.seq) == {sim.hang_seq} == {21}
    latest = inflight.groupby("rank").time_ns.max() - inflight.groupby("rank").entered_ns.first()
    assert (latest / 1e9 >= 10).all() and set(inflight.group_ranks) == {"0-15"}
    assert set(beats["rank"]) == set(range(16)) and beats[beats["rank"] == 5].inflight.max() == 0
    assert (beats.groupby("rank").time_ns.max() >= sim.end_ns - 1e9).all()  # everyone beats until the snapshot
    stuck = stacks[stacks["rank"] == 5].iloc[0]
    assert (
        stuck.innermost.endswith("in simulated_stall")
        and stuck.reason == "missing from reduce_scatter_tensor #21 of world"
    )
    assert stacks[stacks["rank"] != 5].reason.str.startswith("hang: reduce_scatter_tensor world #21").all()


def test_a_slow_link_stretches_the_step_where_data_moves_and_leaves_compute_alone():
    """World group only, host 1's link 4x slower in steps 3-4: every collective of those steps moves
    its data 4x as long, the step grows by 3x the union of its transfers (the next step starts that
    much later), compute timers keep their durations, and the steps around are as without it."""
    shape = dict(ranks=8, hosts=4, steps=7, world_only=True, run_id="w")
    slow = simulate.Simulation(**shape, slow_links=(simulate.SlowLink.parse("1:4@3-5"),))
    calm = simulate.Simulation(**shape)
    assert not slow.host_groups
    comm, base = slow.block(0, 8)["comm"].to_pandas(), calm.block(0, 8)["comm"].to_pandas()
    took = (comm.end_ns - comm.start_ns) - (base.end_ns - base.start_ns)
    transfer = base.end_ns - base.start_ns
    in_slow = comm.step.isin([3, 4])
    assert (took[~in_slow] == 0).all()
    # (the measured transfer holds the entry jitter, up to JITTER_NS, which the stretch does not)
    assert ((took[in_slow] - 3 * transfer[in_slow]).abs() <= 3 * simulate.JITTER_NS).all()
    union = slow.step_starts(np.arange(8)) - calm.step_starts(np.arange(8))
    grown = np.diff(union)  # what each step added
    assert (grown[[0, 1, 2, 5, 6]] == 0).all() and grown[3] == grown[4] > 0
    span = transfer[base.step == 0].groupby(base["rank"]).sum().min()  # the transfers, overlaps counted twice
    assert grown[3] <= 3 * span
    timers, calm_timers = slow.block(0, 8)["timers"].to_pandas(), calm.block(0, 8)["timers"].to_pandas()
    for name in ("fwd", "bwd_inner"):  # compute: the same durations
        assert (timers[timers.name == name].dur_ns.values == calm_timers[calm_timers.name == name].dur_ns.values).all()
    step = timers[timers.name == "step"].set_index(["rank", "step"])
    calm_step = calm_timers[calm_timers.name == "step"].set_index(["rank", "step"])
    ends = (step.start_ns + step.dur_ns) - (calm_step.start_ns + calm_step.dur_ns)
    # a step's last timer ends what the stretching added later, on every rank
    assert (ends.xs(3, level="step") == union[4]).all() and (ends.xs(6, level="step") == union[6]).all()


def test_telemetry_of_a_slow_links_host_arrives_unevenly_while_it_lasts_and_only_then():
    sim = simulate.Simulation(
        ranks=8, hosts=2, steps=60, world_only=True, slow_links=(simulate.SlowLink(1, 4.0, 20, 40),)
    )
    rows = telemetry.delivery_rows(sim, np.arange(8), sim.steps).to_pandas()
    rows["lag_ms"] = (rows.received_ns - rows.made_ns) / 1e6
    rows["host"] = rows["rank"] // 4
    spacing = rows.sort_values(["rank", "made_ns"]).groupby("rank").made_ns.diff().dropna()
    assert (spacing == telemetry.FLUSH_NS).all()  # a client flushes on its timer
    during = rows.step.between(20, 39)
    assert rows[~during | (rows.host == 0)].lag_ms.max() <= 2.0  # the route: 1-2 ms
    queued = rows[during & (rows.host == 1)].lag_ms
    assert queued.max() > 20 and queued.median() > 5
    # telemetry on another network than the training traffic: no queue
    apart = telemetry.delivery_rows(dataclasses.replace(sim, telemetry_apart=True), np.arange(8), sim.steps)
    assert (pc.subtract(apart["received_ns"], apart["made_ns"]).to_numpy() <= 2e6).all()
