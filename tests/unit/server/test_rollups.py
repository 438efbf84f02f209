"""Rollups as steps settle (every collector, no retention asked for): a simulated run streamed into
a live collector gets its per-step comm rollup and step analysis stored by compaction, keeps every
raw record, and answers the health queries exactly as the same run computed from raw records only.
A run that is still going (one rank hung) has its settled steps stored and the rest computed."""

from __future__ import annotations

from collector.data import layout
from collector.server.compaction import CompactionConfig
from collector.testing import fake_runs


def test_a_run_with_nothing_new_is_passed_over_until_its_records_move_on(tmp_path):
    """A pass that found no window ready remembers its run's folders; the next pass skips the run
    while they are unchanged, and rolls up as soon as later steps (then the run's end) land."""
    from collector.data.codec import envelope_rows
    from collector.server.compaction import Compactor
    from collector.server.store import Store

    run = fake_runs.FakeRun(run_id="growing", world_size=4, steps=40, collectives_per_step=4)
    store = Store(tmp_path)
    seqs = dict.fromkeys(range(run.world_size), 1)

    def send(rank: int, rows: list) -> None:
        seqs[rank] += 1
        store.submit(run.client_id(rank), seqs[rank], rows, lambda error: None)

    try:
        for rank in range(run.world_size):
            send(rank, envelope_rows(fake_runs.envelope(run.client_id(rank), 1, hello=run.hello(rank))))
        first_half, second_half = run.comm_chunks(20)
        for rank in range(run.world_size):
            send(rank, [("comm", run.run_id, run.comm_arrow(rank, *first_half))])
        store.flush()
        retention = Compactor(tmp_path, store.ledger, CompactionConfig(retention_window=5)).retention
        partition = layout.partition_dir(tmp_path, "comm", run.run_id)
        assert retention.run(partition)  # steps 0..18: every rank has reported step 19
        assert not retention.run(partition)  # nothing new: looked at, found nothing
        assert partition in retention._idle
        assert not retention.run(partition)  # nothing new: passed over
        for rank in range(run.world_size):
            send(rank, [("comm", run.run_id, run.comm_arrow(rank, *second_half))])
            send(rank, envelope_rows(fake_runs.run_end(run.client_id(rank), 0, run.run_id, rank)))
        store.flush()
        assert retention.run(partition)  # the folders changed: the rest is rolled up
        assert retention._rolled_through(run.run_id) == run.steps - 1
    finally:
        store.close()
