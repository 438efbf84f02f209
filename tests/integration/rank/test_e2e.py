"""End to end: 4 gloo ranks (torch.multiprocessing spawn) call plain
torch.distributed with collector.hook attached; records go through the real
collector (collector.server.service) into Parquet and are checked with DuckDB
(collector.data.catalog). DDP, FSDP2 and clock offsets: tests/integration/rank/test_frameworks.py."""

from __future__ import annotations

import pytest

from collector.data import catalog
from tests.integration.rank import _rank_workers as workers
from tests.integration.rank._rank_util import spawn

W, N = workers.WORLD, workers.N
F32 = 4

# op -> bytes S per nccl-tests for the calls in _rank_workers.collectives_worker
EXPECTED_BYTES = {
    "all_reduce": N * F32,
    "all_gather": N * W * F32,
    "all_gather_into_tensor": N * W * F32,
    "reduce_scatter": N * W * F32,
    "reduce_scatter_tensor": N * W * F32,
    "all_to_all": N * W * F32,
    "all_to_all_single": N * W * F32,
    "broadcast": N * F32,
    "reduce": N * F32,
    "gather": N * W * F32,
    "scatter": N * W * F32,
    "barrier": 0,
    "all_reduce_coalesced": 3 * N * F32,
}


def test_four_ranks_every_collective_recorded_and_joinable(live_collector, tmp_path):
    endpoint, data = live_collector
    results = spawn(workers.collectives_worker, W, endpoint, tmp_path)
    run_ids = {r["run_id"] for r in results}
    assert len(run_ids) == 1, "all ranks of one job share one run_id"
    run_id = run_ids.pop()
    assert run_id.startswith("e2e-job-")

    con = catalog.connect(data)
    q = lambda sql, *p: con.execute(sql, list(p)).fetchall()
    assert q("SELECT name, world_size, status FROM runs WHERE run_id = ?", run_id) == [("e2e-job", W, "finished")]
    assert q("SELECT rank, clock_offset_ns, dropped_records FROM ranks WHERE run_id = ? ORDER BY rank", run_id) == [
        (r, 0, 0) for r in range(W)
    ]  # one host: offsets are exactly 0

    # counts per rank and op
    counts = {(r, op): n for r, op, n in q("SELECT rank, op, count(*) FROM comm WHERE run_id = ? GROUP BY ALL", run_id)}
    for rank in range(W):
        for op, n in workers.WORLD_OPS.items():
            sub = workers.SUB_ALL_REDUCES if op == "all_reduce" and rank in workers.SUB_RANKS else 0
            assert counts.get((rank, op)) == n + sub, (rank, op)
    p2p = {(r, op) for (r, op) in counts if op in ("send", "recv", "isend", "irecv")}
    assert p2p == {(0, "send"), (1, "recv"), (2, "isend"), (3, "irecv")}

    # bytes, group sizes, bandwidth and the step on world-group ops
    for op, nbytes, size, algbw, busbw, step, start, end in q(
        "SELECT op, bytes, group_size, algbw_gbs, busbw_gbs, step, start_ns, end_ns FROM comm "
        "WHERE run_id = ? AND group_name = 'world'",
        run_id,
    ):
        assert nbytes == EXPECTED_BYTES[op], op
        assert size == W and step == 7 and end >= start
        if nbytes and end > start:
            assert algbw == pytest.approx(nbytes / (end - start), rel=1e-9)
            factor = {"all_reduce": 1.5, "all_reduce_coalesced": 1.5, "broadcast": 1.0, "reduce": 1.0}.get(op, 0.75)
            assert busbw == pytest.approx(algbw * factor, rel=1e-9)
    assert q(
        "SELECT DISTINCT group_name, group_size, bytes, dtype FROM comm WHERE run_id = ? AND op = 'all_reduce' "
        "AND group_name <> 'world'",
        run_id,
    ) == [("g[0,2]", 2, 2 * N * 8, "float64")]
    assert q(
        "SELECT group_name, rank, peer, bytes FROM comm WHERE run_id = ? AND group_name LIKE 'p2p%' ORDER BY rank",
        run_id,
    ) == [
        ("p2p[0->1]", 0, 1, N * F32),
        ("p2p[0->1]", 1, 0, N * F32),
        ("p2p[2->3]", 2, 3, N * F32),
        ("p2p[2->3]", 3, 2, N * F32),
    ]
    assert q("SELECT count(*) FROM comm WHERE run_id = ? AND async_op", run_id) == [(W + 2,)]

    # seq joins one collective instance across the ranks of its group
    bad = q(
        """SELECT group_name, seq, count(DISTINCT op), count(*), any_value(group_size)
               FROM comm WHERE run_id = ? GROUP BY group_name, seq
               HAVING (count(DISTINCT op) <> 1 AND group_name NOT LIKE 'p2p%')  -- p2p: send joins recv
                      OR count(*) <> any_value(group_size)""",
        run_id,
    )
    assert bad == []
    # seq is the world group's own collective number: the session's set-up collectives and ops issued
    # inside torch (all_gather_object's size exchange) take numbers too, so the rows have gaps
    n_world = sum(workers.WORLD_OPS.values())
    [(first, count)] = q(
        "SELECT min(seq), count(DISTINCT seq) FROM comm WHERE run_id = ? AND group_name = 'world'", run_id
    )
    assert first >= 1 and count == n_world

    # log_summary on every rank agrees with the stored rows
    for rank, res in enumerate(results):
        s = res["summary"]
        assert s["all_reduce"][str(N * F32)]["count"] == 4
        assert s["all_gather"][str(N * W * F32)]["count"] == 2
        assert s["all_reduce"][str(N * F32)]["total_straggler_ms"] >= 0
        # DeepSpeed's straggler effect: own latency - min over ranks. Rank 0 came late
        # to the barrier, so it waited least; the others waited for it.
        barrier = s["barrier"]["0"]
        if rank == 0:
            assert barrier["total_straggler_ms"] == 0.0
        else:
            assert barrier["total_straggler_ms"] > 0.5 * workers.STRAGGLE_S * 1e3
    con.close()
