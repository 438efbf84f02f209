"""Tensor parallelism: a tiny GPT built from trainer.tensor_parallel blocks,
tp 2 x dp 2 on 4 gloo ranks, trains 20 steps with losses equal to a
single-process dense GPT (same weights, same batches) within 1e-5. The data-
parallel gradient all_reduce is done in the test with trainer.moe.reduce_gradients
over the dp group (the engine does not build tp/dp groups yet). Records go to a
real collector: all_reduce on the tensor-parallel groups (size 2, busbw = algbw
x 2(n-1)/n with n = 2) and on the data-parallel groups. An MoE layer inside the
tensor-parallel model (tests.integration.trainer.test_moe_parallel.check_case with tp 2) runs its
all_to_all over the data-parallel ranks and matches its reference too.

Split by tier: the pure-function tests are in tests/unit/trainer/test_tp_gpt.py."""

from __future__ import annotations

import os

import pytest
import torch

from collector.data import catalog
from collector.testing.gloo import leave_world, run_ranks
from tests.integration.trainer.test_moe_parallel import check_case
from tests.unit.trainer.test_tp_gpt import BATCH, HIDDEN, LAYERS, SEQ, STEPS, train_and_compare
from trainer.tensor_parallel import ParallelTransformerBlock, parallel_groups

WORLD, TP = 4, 2
MOE_STEP = 100  # telemetry step of the MoE-under-TP check


def worker(rank: int, port: int, endpoint: str) -> None:
    from collector.rank import session
    from trainer import comm

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    session.start(run="tp-gpt", endpoint=endpoint)
    comm.init_process_group("gloo", rank=rank, world_size=WORLD)
    with pytest.raises(ValueError) as e:
        parallel_groups(3)
    assert str(e.value) == "tensor_parallel.tp_size: must divide the world size 4 (got 3)"
    groups = parallel_groups(TP)
    with pytest.raises(ValueError) as e:
        ParallelTransformerBlock(12, 3, groups=groups)
    assert str(e.value) == "tensor_parallel.tp_size: must divide the number of attention heads 3 (got 2)"
    diffs = train_and_compare(groups, STEPS)
    assert max(diffs) < 1e-5, diffs
    # an MoE layer inside a tensor-parallel model: experts span the data-parallel ranks
    check_case(rank, MOE_STEP, ep=2, k=1, drop=True, tp=TP)
    session.stop()
    leave_world()


def test_tp2_dp2_gpt_matches_dense_reference_and_records_tp_groups(live_collector):
    endpoint, data = live_collector
    run_ranks(worker, WORLD, endpoint)

    con = catalog.connect(data)
    q = lambda sql, *p: con.execute(sql, list(p)).fetchall()
    (run_id,) = q("SELECT run_id FROM runs WHERE name = 'tp-gpt'")[0]
    rows = q(
        """SELECT rank, group_name, group_size, log_name, count(*), count(DISTINCT step), min(bytes), max(bytes)
                FROM comm WHERE run_id = ? AND op = 'all_reduce' AND step < ? GROUP BY ALL ORDER BY ALL""",
        run_id,
        STEPS,
    )
    act = BATCH * SEQ * HIDDEN * 4  # one [B, T, H] fp32 activation
    expected = []
    for rank in range(WORLD):
        tp_group = "tp[0-1]" if rank < 2 else "tp[2-3]"
        dp_group = "dp[0,2]" if rank % 2 == 0 else "dp[1,3]"
        n_params = 2 + 4 * LAYERS * 2 + 2 * LAYERS * 2 + 2 + 1  # wte, wpe; linear w+b; ln w+b; ln_f; head
        expected += [
            (rank, dp_group, 2, "reduce_gradients", n_params * STEPS, STEPS, None, None),
            (rank, tp_group, 2, "tp.copy_to_tp.backward", 2 * LAYERS * STEPS, STEPS, act, act),
            (rank, tp_group, 2, "tp.reduce_from_tp", 2 * LAYERS * STEPS, STEPS, act, act),
        ]
    got = [r[:6] + ((r[6], r[7]) if r[3] != "reduce_gradients" else (None, None)) for r in rows]
    assert sorted(got) == sorted(expected)
    # busbw uses the group's size: all_reduce factor 2(n-1)/n = 1.0 for n = 2 (the world's would be 1.5)
    bad = q(
        """SELECT count(*) FROM comm WHERE run_id = ? AND op = 'all_reduce' AND end_ns > start_ns
               AND abs(busbw_gbs - algbw_gbs * 2 * (group_size - 1) / group_size) > 1e-9 * algbw_gbs""",
        run_id,
    )
    assert bad == [(0,)]
    assert q(
        """SELECT count(*) FROM (SELECT group_name, seq, count(*) n, any_value(group_size) g FROM comm
                WHERE run_id = ? GROUP BY ALL HAVING n <> g)""",
        run_id,
    ) == [(0,)]
    # MoE under tp 2: all_to_all on the data-parallel ranks [0,2] / [1,3]; experts are not replicated
    # over data-parallel ranks there (ep 2 = dp 2), so no expert-gradient all_reduce. Tokens move
    # in 4 all_to_alls (dispatch, combine and their backwards) plus one of the experts' fill counts.
    assert q(
        """SELECT rank, group_name, group_size, count(*) FROM comm WHERE run_id = ? AND step = ?
                AND op = 'all_to_all_single' GROUP BY ALL ORDER BY rank""",
        run_id,
        MOE_STEP,
    ) == [(r, "dp[0,2]" if r % 2 == 0 else "dp[1,3]", 2, 5) for r in range(WORLD)]
    assert q("SELECT count(*) FROM comm WHERE run_id = ? AND log_name = 'moe.reduce_expert_gradients'", run_id) == [
        (0,)
    ]
    con.close()
