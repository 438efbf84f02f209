"""Two gloo ranks, one spawn, three checks: the clock offset between "hosts",
DDP under attach() (buckets recorded through ddp_comm_hook, gradients still the
average), and FSDP2's collectives recorded. Records go through the real
collector into Parquet and are read back with DuckDB."""

from __future__ import annotations

import pytest

from collector.data import catalog
from collector.testing import flight_recorder
from collector.testing.collectors import live_collector
from tests.integration.rank import _rank_workers as workers
from tests.integration.rank._rank_util import spawn

F32 = 4


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two_ranks")
    with live_collector(tmp / "data") as (endpoint, _):
        results = spawn(workers.two_rank_worker, 2, endpoint, tmp)
    return results, tmp / "data", tmp


def test_clock_offset_across_hosts_is_measured(two_ranks):
    """Rank 1 on another "host" with a clock 5 s ahead: its offset is 5 s within
    a few ms (barrier exit skew on one machine); rank 0's is exactly 0."""
    results, *_ = two_ranks
    assert results[0]["clock_offset"] == 0
    assert results[1]["clock_offset"] == pytest.approx(workers.SKEW_NS, abs=20_000_000)


def test_ddp_buckets_are_recorded_and_gradients_still_averaged(two_ranks):
    results, data, _ = two_ranks  # the worker asserted the gradients against a reference
    run_id = results[0]["ddp_run_id"]
    assert results[1]["ddp_run_id"] == run_id
    con = catalog.connect(data)
    rows = con.execute(
        "SELECT rank, op, log_name, async_op, bytes FROM comm WHERE run_id = ? ORDER BY rank", [run_id]
    ).fetchall()
    con.close()
    assert rows == [(r, "all_reduce", "ddp_bucket_all_reduce", True, (8 * 3 + 3) * F32) for r in range(2)]


def test_fsdp2_collectives_are_recorded(two_ranks):
    results, data, _ = two_ranks
    counts = results[0]["fsdp_counts"]
    assert counts == results[1]["fsdp_counts"]
    gather_op = "all_gather_into_tensor"  # FSDP2 calls all_gather_single where it exists; the row keeps the long name
    assert counts[gather_op] > 0
    con = catalog.connect(data)
    rows = con.execute(
        "SELECT op, count(*) FROM comm WHERE run_id = ? AND rank = 0 GROUP BY op", [results[0]["fsdp_run_id"]]
    ).fetchall()
    con.close()
    assert dict(rows) == counts
    assert results[0]["ddp_run_id"] != results[0]["fsdp_run_id"]  # a second session in the same job: a new run


@pytest.mark.parametrize("run", ["ddp_run_id", "fsdp_run_id"])
def test_ddp_and_fsdp2_collectives_are_flight_recorders_entries_at_the_same_seq(two_ranks, run):
    """Every recorded collective (DDP's buckets through the comm hook; FSDP2's all_gather /
    reduce_scatter on its device mesh's group) equals the entry torch's Flight Recorder holds at
    the same (process group, collective_seq_id) on that rank, in op and size."""
    results, data, out = two_ranks
    con = catalog.connect(data)
    for rank in range(2):
        cur = con.execute(
            "SELECT group_name, seq, op, numel FROM comm WHERE run_id = ? AND rank = ?", [results[0][run], rank]
        )
        rows = [dict(zip([d[0] for d in cur.description], r, strict=True)) for r in cur.fetchall()]
        assert rows
        assert flight_recorder.mismatches(rows, flight_recorder.load(out, rank)) == [], (run, rank)
    con.close()
