"""The engine side of the flops profiler: the ``flops_profiler`` config block,
one profiled step (report on rank 0, one ``flops`` row per module), and the
bundled engine streaming the tree through a real collector into DuckDB.

Split by tier: the pure-function tests are in tests/unit/trainer/test_profiling_step.py."""

from __future__ import annotations

import torch

from tests.unit.trainer.test_profiling_step import make_model, printed
from trainer.profiling.report import fmt_count


def _config(**blocks) -> dict:
    """The engine config both tests train with (batch 8, AdamW, quiet), plus ``blocks``."""
    return {
        "train_batch_size": 8,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "steps_per_print": 1000,
        **blocks,
    }


def test_engine_zero3_counts_partitioned_parameters_in_full(tmp_path):
    """ZeRO-3 frees each module's parameters outside its forward; the profile
    still reports the full parameter count and the same MACs as stage 0."""
    import torch.distributed as dist

    import trainer

    model = make_model()
    params = sum(p.numel() for p in model.parameters())
    try:
        engine, *_ = trainer.initialize(
            model=model,
            config=_config(
                telemetry={"enabled": False},
                zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0},
                flops_profiler={"enabled": True, "profile_step": 0, "output_file": str(tmp_path / "f.txt")},
            ),
        )
        for _ in range(2):
            engine.backward(engine(torch.randn(8, 16)).pow(2).mean())
            engine.step()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert sum(p.numel() for p in model.parameters()) < params, "stage 3 released the parameters"
    root = engine.profiler.rows[0]
    assert root["params"] == params
    assert root["macs"] == 8 * (16 * 64 + 64 * 64 + 64 * 4)


def test_engine_streams_the_tree_through_the_collector(tmp_path, live_collector):
    """The bundled engine with ``flops_profiler`` on: rows land in the real
    collector's Parquet and read back from the DuckDB catalog."""
    import torch.distributed as dist

    import trainer
    from collector.data import catalog
    from collector.rank import session

    endpoint, data = live_collector
    report_file = tmp_path / "flops.txt"
    try:
        model = make_model()
        engine, *_ = trainer.initialize(
            model=model,
            config=_config(
                wall_clock_breakdown=True,
                telemetry={"enabled": True, "endpoint": endpoint, "run": "flops-e2e"},
                flops_profiler={"enabled": True, "profile_step": 1, "output_file": str(report_file)},
            ),
        )
        for _ in range(3):
            loss = engine(torch.randn(8, 16)).pow(2).mean()
            engine.backward(loss)
            engine.step()
        session.stop()
        con = catalog.connect(data)
        rows = con.execute(
            "SELECT module, parent, depth, module_type, flops, macs, latency_ns, bwd_latency_ns, step, rank "
            "FROM flops ORDER BY depth, module"
        ).fetchall()
    finally:
        session.stop()
        if dist.is_initialized():
            dist.destroy_process_group()

    assert len(rows) == len(list(model.named_modules()))
    assert {(r[8], r[9]) for r in rows} == {(1, 0)}, "profile_step 1, from rank 0"
    root = rows[0]
    assert root[:4] == ("", "", 0, "Sequential")
    assert root[5] == 8 * (16 * 64 + 64 * 64 + 64 * 4)
    assert printed(report_file.read_text(), "fwd flops per rank") == fmt_count(root[4])
    assert all(r[6] > 0 and r[7] > 0 for r in rows)
