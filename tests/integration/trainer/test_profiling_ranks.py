"""Two gloo ranks (torch.multiprocessing spawn) train with the bundled engine
and ``flops_profiler`` on: every rank streams its module tree through the real
collector into the ``flops`` table; only rank 0 prints the report."""

from __future__ import annotations

import json
import os

import torch
from torch import nn


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Sequential(nn.Linear(64, 64), nn.Tanh()), nn.Linear(64, 4))


def _two_rank_worker(rank: int, master_port: int, endpoint: str, out: str) -> None:
    import torch.distributed as dist

    import trainer
    from collector.rank import session

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
    torch.set_num_threads(1)
    engine, *_ = trainer.initialize(
        model=make_model(),
        config={
            "train_batch_size": 8,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "steps_per_print": 1000,
            "telemetry": {"enabled": True, "endpoint": endpoint, "run": "flops-2ranks"},
            "flops_profiler": {"enabled": True, "profile_step": 0, "output_file": os.path.join(out, "flops.txt")},
        },
    )
    for _ in range(2):
        engine.backward(engine(torch.randn(4, 16)).pow(2).mean())
        engine.step()
    session.stop()
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"printed": engine.profiler.report is not None, "rows": len(engine.profiler.rows)}, f)


def test_every_rank_sends_its_tree_and_only_rank0_prints(tmp_path, live_collector):
    from collector.data import catalog
    from tests.integration.rank._rank_util import spawn

    endpoint, data = live_collector
    results = spawn(_two_rank_worker, 2, endpoint, tmp_path)
    rows = (
        catalog.connect(data)
        .execute(
            "SELECT rank, count(*), sum(CASE WHEN depth = 0 THEN macs END) FROM flops "
            "WHERE step = 0 GROUP BY rank ORDER BY rank"
        )
        .fetchall()
    )
    modules = len(list(make_model().named_modules()))
    assert [r["printed"] for r in results] == [True, False]
    assert [r["rows"] for r in results] == [modules, modules]
    per_rank_macs = 4 * (16 * 64 + 64 * 64 + 64 * 4)  # micro-batch 4 on each of 2 ranks
    assert rows == [(0, modules, per_rank_macs), (1, modules, per_rank_macs)]
