"""A network partition between real ranks and the collector (issue 49): two gloo ranks in one
network namespace, the collector in another, its link dropping every packet for a while (so the
ranks' stream hangs, as in a real partition, rather than being refused), then healed.

Training goes on through the partition; the ranks notice it by their keepalive pings and spool
(their memory holds at most what came before the pings failed); after the heal every record arrives
exactly once; the run's findings say there was a gap (``network_gap``) and call no rank stopped,
silent or hung, nor does ``rankscope health``. The default tier cuts for 25 s; the slow tier for
10 minutes with a small spool limit, where the oldest records go and are counted. Figures (step
times, memory, spool over time): benches/partition.py."""

from __future__ import annotations

import pytest

from collector.rank.client import KEEPALIVE_S, KEEPALIVE_TIMEOUT_S, MAX_UNACKED_BYTES
from collector.testing import netns
from collector.testing.partition import Outcome, PartitionRun, outcome, partition_run

UNAVAILABLE = netns.unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"network namespaces: {UNAVAILABLE}")


def check(run: PartitionRun, partition_s: float) -> Outcome:
    """Everything a partition must leave right, and the run's gap finding's evidence."""
    cut = [s for r in run.reports for s in r["samples"] if run.cut_at <= s["t"] < run.healed_at]
    assert cut, "no sample taken during the partition"
    # training went on: steps of ~50 ms, most of them made while cut off
    for report in run.reports:
        steps = [s["step"] for s in report["samples"] if run.cut_at <= s["t"] < run.healed_at]
        assert steps[-1] - steps[0] >= partition_s * 4, f"rank {report['rank']} trained {steps} while cut off"
    # the ranks noticed (keepalive) and spooled; in memory never more than the bound
    assert any(s["spool"] > 0 for s in cut), "nothing was spooled during the partition"
    assert max(s["unacked"] for s in cut) <= MAX_UNACKED_BYTES
    noticed = run.cut_at + KEEPALIVE_S + KEEPALIVE_TIMEOUT_S + 5  # the pings failed by then
    assert all(s["queued"] == 0 for s in cut if s["t"] > noticed), "envelopes queued on a dead stream"

    got = outcome(run)
    assert got.stored == got.distinct, f"{got.stored - got.distinct} timers rows stored twice"
    # every row not stored was counted dropped; the count is an upper bound: rows the collector
    # stored whose ack the partition swallowed, and that the rank then dropped from its spool, count too
    counts = f"{got.stored} stored, {got.dropped} dropped, {got.made} made"
    assert got.stored <= got.made <= got.stored + got.dropped, counts
    found = got.found
    kinds = {f.kind for f in found}
    assert not kinds & {"rank_stopped", "silent_rank", "hang", "stuck"}, [f.text for f in found]
    gaps = [f for f in found if f.kind == "network_gap"]
    assert len(gaps) == 1 and gaps[0].ranks == (0, 1), [f.text for f in found]
    gap = gaps[0]
    assert partition_s - 1 <= gap.evidence["seconds"] <= partition_s + 20, gap.text
    assert gap.evidence["dropped_records"] == got.dropped and gap.severity == ("warning" if got.dropped else "info")

    health = got.health
    assert health.returncode in (0, 1), health.stdout + health.stderr
    assert "heard nothing from ranks 0-1" in health.stdout, health.stdout
    for word in ("silent", "stopped at", "crashed", "hang", "stuck"):
        assert word not in health.stdout, health.stdout
    return got


def test_a_partition_loses_nothing_and_is_named_a_gap(tmp_path):
    run = partition_run(tmp_path, warm_s=3, partition_s=25, after_s=6)
    got = check(run, 25)
    assert got.dropped == 0 and got.stored == got.made


@pytest.mark.slow  # 10 minutes cut off on purpose
@pytest.mark.timeout(1200)
def test_ten_minutes_cut_off_stays_within_the_spool_limit(tmp_path):
    limit = 8 << 20
    run = partition_run(tmp_path, warm_s=10, partition_s=600, after_s=30, max_spool_bytes=limit, timeout_s=900)
    got = check(run, 600)
    cut = [s for r in run.reports for s in r["samples"] if run.cut_at <= s["t"] < run.healed_at]
    # a file over the limit is written before the oldest go: at most one file's worth above it
    assert max(s["spool"] for s in cut) <= 2 * limit
    assert got.dropped > 0, "the 8 MiB spool limit was never reached: the test no longer tests it"
