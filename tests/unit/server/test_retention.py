"""Retention in a live collector (`collect --raw-every N`): a simulated run streamed into a
collector that thins out raw comm records keeps every Nth step raw plus the steps with
findings, the per-step rollup for every step, and the Stragglers/Comms queries and
`rankscope health` agree with the same run kept fully raw (within 5%), saying where they
read rollups.

Split by tier: what needs processes, sockets or seconds is in tests/integration/server/test_retention.py."""

from __future__ import annotations

import pytest

from collector.data import catalog, queries
from collector.server.compaction import CompactionConfig
from collector.tools import simulate


def query(d, fn, *args):
    cat = queries.Catalog(d)
    try:
        return fn(cat, *args)
    finally:
        cat.close()


def test_windows_of_a_live_run_roll_up_each_step_once(tmp_path):
    """A run arriving ten steps at a time: windows close only once every rank is past them,
    segments reaching past a window are split at it, and in the end every step is in the rollup
    exactly once and the pages match the raw run."""
    from collector.data.codec import envelope_rows
    from collector.server.retention import Retention
    from collector.server.store import Store
    from collector.tools.importers.sink import envelope

    sim = simulate.Simulation(ranks=8, steps=30, stragglers=(simulate.Straggler(2, 20_000_000, 25),), run_id="w")
    comm = sim.block(0, sim.ranks)["comm"]
    d = tmp_path / "data"
    catalog.ensure_catalog(d)
    store = Store(d)
    retention = Retention(d, store.ledger, CompactionConfig(raw_every=5, retention_window=10))
    partition = d / "parquet" / "comm" / f"run={sim.run_id}"
    seq = iter(range(1, 1000))

    def submit(rows):
        store.submit("test", next(seq), rows, lambda e: None)
        store.flush()

    submit([r for rank in range(sim.ranks) for r in envelope_rows(envelope("h", 1, hello=sim.hello(rank)))])
    rolled = []
    for first in range(0, 30, 10):
        step = comm.column("step").to_numpy()
        submit([("comm", sim.run_id, comm.filter((step >= first) & (step < first + 10)))])
        retention.run(partition)
        rolled.append(retention._rolled_through(sim.run_id))
    assert rolled == [-1, 18, 28]  # each window waits for every rank to move past it
    submit([r for rank in range(sim.ranks) for r in envelope_rows(envelope("e", 1, end=sim.run_end(rank)))])
    retention.run(partition)
    assert retention._rolled_through(sim.run_id) == 29
    store.close()
    catalog.ensure_catalog(d)
    con = catalog.connect(str(d))
    assert con.execute("SELECT count(*), count(DISTINCT (rank, step, op, bytes)) FROM comm_steps").fetchone() == (
        8 * 30 * 5,
        8 * 30 * 5,
    )
    raw_steps = {s for (s,) in con.execute("SELECT DISTINCT step FROM comm").fetchall()}
    con.close()
    # exactly the policy's steps: a segment a window boundary cut through is split, not kept whole
    assert raw_steps == {0, 5, 10, 15, 20, 25, 26, 27, 28, 29}
    full = tmp_path / "full"
    simulate.write_data_dir(sim, full)
    a, b = (query(x, queries.comm_rollup, sim.run_id) for x in (full, d))
    for name in ("last_arrivals", "log_summary", "bandwidth_by_step"):
        fa, fb = (getattr(queries, name)(r, queries.CommFilter()) for r in (a, b))
        numeric = [c for c in fa.columns if fa[c].dtype.kind in "fi"]
        for col in numeric:
            assert fb[col].to_numpy() == pytest.approx(fa[col].to_numpy(), rel=1e-9, nan_ok=True), f"{name}.{col}"


def test_artifact_requests_beyond_the_newest_kept_are_dropped_dated_by_their_first_row():
    import pandas as pd

    from collector.data.retention import artifact_requests_to_drop

    rows = pd.DataFrame(
        {
            # b answered first, then a, c; c's capture row came last, a's captured row later than c's start
            "request_id": ["b", "a", "c", "a", "b", "c"],
            "time_ns": [10, 20, 30, 45, 50, 60],
        }
    )
    assert artifact_requests_to_drop(rows, kept=2) == {"b"}
    assert artifact_requests_to_drop(rows, kept=1) == {"a", "b"}
    assert artifact_requests_to_drop(rows, kept=3) == set()
    assert artifact_requests_to_drop(rows.iloc[:0], kept=1) == set()
    with pytest.raises(ValueError, match="kept must be >= 1"):
        artifact_requests_to_drop(rows, kept=0)
