"""Kill at every point (issue 49), the make-test size: a real collector SIGKILLed at seeded random
moments of ingest, flush, compaction and rollup, restarted on the same data dir, and a rank
SIGKILLed mid-spool-write and mid-resend. After every kill a reader opens every view and every
segment the manifest names; at the end every acked record is stored exactly once. The full count
(200 collector kills, 50 rank kills) is benches/reliability_kills.py's."""

from __future__ import annotations

from collector.testing.kill_harness import kill_collectors, kill_ranks


def test_collector_kills_lose_nothing_double_nothing_and_readers_never_fail(tmp_path):
    report = kill_collectors(tmp_path / "data", kills=4, seed=49, max_delay_s=1.0, steps=8)
    assert report.ok, report.problems()
    assert report.kills == 4 and report.rows_stored == report.rows_expected > 0
    assert report.killed_with_unacked > 0, "every kill came after everything was acked: no kill mid-ingest"
    assert report.resent_acked > 0, "no acked envelope was sent again: dedupe not exercised"


def test_rank_kills_mid_spool_and_mid_resend_leave_whole_files_delivered_once(tmp_path):
    report = kill_ranks(tmp_path, kills=4, seed=49)
    assert report.ok, report.problems()
    assert report.rows_stored == report.rows_expected > 0, "nothing was spooled before the kills"
