"""Rollups as steps settle, on a Store fed directly: a pass that found nothing to roll up passes the
run over until its records move on. (Through a live collector: tests/integration/server/test_rollups.py.)

Split by tier: what needs processes, sockets or seconds is in tests/integration/server/test_rollups.py."""

from __future__ import annotations

from collector.data import layout
from collector.server.compaction import CompactionConfig
from collector.testing import fake_runs


def test_a_run_with_nothing_new_is_passed_over_until_its_records_move_on(tmp_path):
    """A pass that found no window ready remembers its run's folders; the next pass skips the run
    while they are unchanged, and rolls up as soon as later steps (then the run's end) land."""
    from collector.server.compaction import Compactor
    from collector.server.store import Store

    run = fake_runs.FakeRun(run_id="growing", world_size=4, steps=40, collectives_per_step=4)
    store = Store(tmp_path)
    feed = fake_runs.StoreFeed(store, run, last_seq=1)
    try:
        for rank in range(run.world_size):
            feed.hello(rank)
        first_half, second_half = run.comm_chunks(20)
        for rank in range(run.world_size):
            feed.comm(rank, first_half)
        store.flush()
        retention = Compactor(tmp_path, store.ledger, CompactionConfig(retention_window=5)).retention
        partition = layout.partition_dir(tmp_path, "comm", run.run_id)
        assert retention.run(partition)  # steps 0..18: every rank has reported step 19
        assert not retention.run(partition)  # nothing new: looked at, found nothing
        assert partition in retention._idle
        assert not retention.run(partition)  # nothing new: passed over
        for rank in range(run.world_size):
            feed.comm(rank, second_half)
            feed.end(rank)
        store.flush()
        assert retention.run(partition)  # the folders changed: the rest is rolled up
        assert retention._rolled_through(run.run_id) == run.steps - 1
    finally:
        store.close()
