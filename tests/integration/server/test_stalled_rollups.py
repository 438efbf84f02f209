"""A run that stops entering collectives (a hang) never fills a rollup window, since its stuck rank
reports no later step; retention rolls up its settled steps once no rank has entered a collective
for the run's hang_after_s (collector.data.hang_rule), so readers stop analysing its whole tail from
raw records, and what they read is what the raw records give. A run still moving within its
hang_after_s keeps waiting for a full window."""

from __future__ import annotations

import time

import pandas as pd
import pyarrow as pa

from collector.data import findings, layout, queries
from collector.data.codec import envelope_rows
from collector.data.schema import TABLES
from collector.server.compaction import CompactionConfig, Compactor
from collector.server.store import Store
from collector.testing import fake_runs
from collector.tools import simulate

STEPS = 12  # far fewer than the window below: only a stall settles them


def _heartbeats(rank: int, hang_after_s: float) -> pa.Table:
    schema = TABLES["heartbeats"].arrow_schema()
    cols = {"step": [STEPS - 1], "time_ns": [time.time_ns()], "period_s": [1.0], "inflight": [0]}
    cols |= {"hang_after_s": [hang_after_s], "ending": [False]}
    arrays = [pa.array([rank], pa.int64())]
    arrays += [pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(1, f.type) for f in list(schema)[1:]]
    return pa.Table.from_arrays(arrays, schema=schema)


def _running_run(data_dir, run_id: str, hang_after_s: float):
    """A 4-rank run, STEPS steps stored, not ended, whose ranks beat with ``hang_after_s``; returns
    the store (open) and the retention of a compactor with a 100-step window."""
    run = fake_runs.FakeRun(run_id=run_id, world_size=4, steps=STEPS, collectives_per_step=4, status="running")
    store = Store(data_dir)
    for rank in range(run.world_size):
        client = run.client_id(rank)
        rows = envelope_rows(fake_runs.envelope(client, 1, hello=run.hello(rank)))
        rows += [("comm", run_id, run.comm_arrow(rank)), ("heartbeats", run_id, _heartbeats(rank, hang_after_s))]
        store.submit(client, 2, rows, lambda error: None)
    store.flush()
    retention = Compactor(data_dir, store.ledger, CompactionConfig(retention_window=100)).retention
    return store, retention, layout.partition_dir(data_dir, "comm", run_id)


def _analysis(d, run_id: str, fn=queries.step_analysis) -> pd.DataFrame:
    cat = queries.Catalog(d)
    try:
        frame = fn(cat, run_id)
    finally:
        cat.close()
    return frame.sort_values(["step", "rank"]).reset_index(drop=True).astype({"rank": "int64", "step": "int64"})


def test_a_run_quiet_for_its_hang_after_s_is_rolled_up_and_reads_as_its_raw_records(tmp_path):
    store, retention, partition = _running_run(tmp_path, "stalled", hang_after_s=0.2)
    try:
        raw = _analysis(tmp_path, "stalled", queries.analyse_steps)
        deadline = time.monotonic() + 60  # the run turns stalled 0.2 s after its last segment landed
        while not retention.run(partition):
            assert time.monotonic() < deadline, "a run quiet for its hang_after_s was not rolled up"
            time.sleep(0.05)
    finally:
        store.close()
    # every rank reported step STEPS - 1, so steps up to STEPS - 2 are settled (no rank can add to them)
    assert retention.done_through["stalled"] == STEPS - 2
    pd.testing.assert_frame_equal(_analysis(tmp_path, "stalled"), raw, check_exact=False, rtol=1e-9)


def test_a_run_that_moved_within_its_hang_after_s_waits_for_a_full_window(tmp_path):
    store, retention, partition = _running_run(tmp_path, "moving", hang_after_s=600.0)
    try:
        assert not retention.run(partition)
        assert "moving" not in retention.done_through
    finally:
        store.close()


def test_a_simulated_hang_is_rolled_up_to_its_settled_steps_with_the_same_findings(tmp_path):
    """Offline (a data dir written without a collector), the run's own clock says how long it has
    been quiet: the simulated hang is a snapshot hang_after_s + 5 s into the hang."""
    sim = simulate.Simulation(ranks=16, steps=20, hang=simulate.Hang(5, 12), run_id="hung", seed=3).anchored_now()
    rolled, raw = tmp_path / "rolled", tmp_path / "raw"
    simulate.write_data_dir(sim, rolled)
    simulate.write_data_dir(sim, raw, rollups=False)
    cat = queries.Catalog(rolled)
    try:
        through = cat.df("SELECT max(step) AS s FROM step_analysis WHERE run_id = ?", ["hung"]).s.iloc[0]
    finally:
        cat.close()
    assert through == sim.hang.step - 2  # every rank reported step hang - 1: the steps before it settled
    said = []
    for d in (rolled, raw):
        cat = queries.Catalog(d)
        try:
            said.append([(f.kind, f.ranks, f.text) for f in findings.for_run(cat, "hung") if f.kind != "silent_rank"])
        finally:
            cat.close()
    assert said[0] == said[1]
    assert any(kind == "hang" for kind, _, _ in said[0])
