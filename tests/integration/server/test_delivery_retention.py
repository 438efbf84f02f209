"""Telemetry arrival times thinned with raw steps (collector.server.delivery_retention): a real
collector with ``--raw-every`` keeps a run's ``deliveries`` rows only around its slow-link finding
(what the finding's tie-break reads), judged window by window as steps settle; without
``--raw-every`` every row stays. The run: a simulated 2-host job (collector.tools.simulate) with
host 1's link 4x slow in steps 60-79, each rank streamed in flushes of STEPS_PER_FLUSH steps, a
pause between them (the collector keeps a deliveries row per flush). The 2-host tie-break on what
is kept, with real links: tests/integration/test_slow_links.py. The policy: tests/unit/data/test_retention.py."""

from __future__ import annotations

import time

import pyarrow.compute as pc
import pytest

from collector.data import findings, queries
from collector.data.deliveries import FLUSH_GAP_NS
from collector.data.retention import DELIVERY_MARGIN_STEPS
from collector.server.compaction import CompactionConfig
from collector.testing.collectors import live_collector
from collector.testing.streams import RawStream
from collector.tools.importers.sink import envelope, table_batches
from collector.tools.simulate import Simulation, SlowLink

STEPS, STEPS_PER_FLUSH = 160, 8
PAUSE_S = 3 * FLUSH_GAP_NS / 1e9  # between flushes: each one a row of its own


def _stream_in_flushes(collector, sim: Simulation) -> None:
    """Every rank's rows, STEPS_PER_FLUSH steps of every table at a time (as a client flushes),
    each rank on its own stream, then RunEnd (the run ended: all its steps settle)."""
    streams = [RawStream(collector.channel()) for _ in range(sim.ranks)]
    seqs = [1] * sim.ranks
    tables = [sim.block(rank, 1) for rank in range(sim.ranks)]

    def send(rank, **what):
        streams[rank].send(envelope(sim.client_id(rank), seqs[rank], **what))
        seqs[rank] += 1

    for rank in range(sim.ranks):
        send(rank, hello=sim.hello(rank))
    for first in range(0, STEPS, STEPS_PER_FLUSH):
        for rank in range(sim.ranks):
            for table, rows in tables[rank].items():
                step = rows["step"]
                chunk = rows.filter(pc.and_(pc.greater_equal(step, first), pc.less(step, first + STEPS_PER_FLUSH)))
                for batch in table_batches(table, sim.run_id, rank, chunk) if chunk.num_rows else []:
                    send(rank, table=batch)
        time.sleep(PAUSE_S)
    for rank, stream in enumerate(streams):
        send(rank, end=sim.run_end(rank))
        stream.finish()
        assert stream.acked == set(range(1, seqs[rank])), stream.error


@pytest.mark.parametrize("raw_every", [10, 0])
def test_deliveries_stay_only_around_the_slow_link_with_retention_and_all_without(tmp_path, raw_every):
    data_dir = tmp_path / "data"
    sim = Simulation(ranks=4, hosts=2, steps=STEPS, slow_links=(SlowLink(1, 4.0, 60, 80),), name="deliv")
    config = CompactionConfig(interval=3600, raw_every=raw_every, retention_window=20)  # passes: compact_until
    with live_collector(data_dir, compaction_config=config) as collector:
        _stream_in_flushes(collector, sim)
        retention = collector.state.compactor.retention
        collector.compact_until(lambda: retention.done_through.get(sim.run_id, -1) >= STEPS - 1, "the run's rollup")
        removed = retention.deliveries.removed_rows
    cat = queries.Catalog(data_dir)
    try:
        [link] = [f for f in findings.for_run(cat, sim.run_id) if f.kind == "slow_link"]
        steps = queries.deliveries(cat, sim.run_id).groupby("rank").step
    finally:
        cat.close()
    assert abs(link.steps[0] - 60) <= 3 and abs(link.steps[1] - 79) <= 3, link.text  # thinning kept the finding
    first, last = link.steps[0] - DELIVERY_MARGIN_STEPS, link.steps[1] + DELIVERY_MARGIN_STEPS
    assert len(steps.size()) == 4
    if raw_every:
        assert removed > 0
        assert (steps.min() >= first).all() and (steps.max() <= last).all(), (steps.min(), steps.max())
        assert (steps.size() >= 2).all(), steps.size()  # the flushes around the link stay
    else:  # a baseline in the same test: the same run, rolled up, every flush kept
        assert removed == 0
        assert (steps.min() < first).all() and (steps.max() > last).all(), (steps.min(), steps.max())
