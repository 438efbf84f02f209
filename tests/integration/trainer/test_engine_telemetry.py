"""The engine's records reach a real collector: 2 gloo ranks train with ZeRO-2 + fp16,
then timers, memory, loss_scale, monitor and comm rows are read back through DuckDB."""

from __future__ import annotations

import os

import pytest

import trainer
from collector.data import catalog
from collector.testing import flight_recorder
from collector.testing.collectors import live_collector
from tests._engine_util import engine_config, make_model, spawn, train

STEPS, BATCH = 4, 8
BUCKETS = -(-sum(p.numel() for p in make_model().parameters()) // 2000)  # reduce_bucket_size 2000


def _train_with_telemetry(rank, world, endpoint, spool_dir):
    cfg = engine_config(stage=2, batch=BATCH, gas=2, clip=1.0, overlap_comm=True)
    cfg.update(
        telemetry={"run": "engine-e2e", "endpoint": endpoint, "spool_dir": spool_dir},
        wall_clock_breakdown=True,
        comms_logger={"enabled": True},
        fp16={"enabled": True, "auto_cast": True, "initial_scale_power": 8},
    )
    engine, *_ = trainer.initialize(model=make_model(), config=cfg)
    train(engine, steps=STEPS, batch=BATCH)
    flight_recorder.dump(os.path.dirname(spool_dir))
    engine.close()
    return {"ok": True}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One 2-rank training run streamed into a live collector; yields a query function and the run filter."""
    tmp = tmp_path_factory.mktemp("engine_telemetry")
    os.environ["TORCH_FR_BUFFER_SIZE"] = "20000"  # the ranks record Flight Recorder: the identity oracle
    try:
        with live_collector(tmp / "data") as (endpoint, _):
            spawn(_train_with_telemetry, 2, tmp / "out", endpoint, str(tmp / "spool"))
    finally:
        del os.environ["TORCH_FR_BUFFER_SIZE"]
    con = catalog.connect(tmp / "data")
    q = lambda sql: con.execute(sql).fetchall()
    [(run_id, world, status)] = q("SELECT run_id, world_size, status FROM runs WHERE name = 'engine-e2e'")
    assert world == 2 and status == "finished"
    yield q, f"WHERE run_id = '{run_id}'", tmp


def test_engine_records_land_in_the_catalog(run):
    q, where, _ = run
    timers = q(f"SELECT rank, name, count(DISTINCT step), min(dur_ns) FROM timers {where} GROUP BY ALL ORDER BY ALL")
    assert {(r, n) for r, n, _, _ in timers} == {
        (r, n) for r in range(2) for n in ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step")
    }
    assert all(steps == STEPS and dur > 0 for _, _, steps, dur in timers)
    kinds = q(f"SELECT DISTINCT rank, kind FROM memory {where} ORDER BY ALL")
    assert kinds == [(r, k) for r in range(2) for k in sorted(("params", "grads", "optimizer", "rss"))]
    scales = q(f"SELECT rank, step, scale_before, overflow FROM loss_scale {where} ORDER BY rank, step")
    assert scales == [(r, s, 256.0, False) for r in range(2) for s in range(STEPS)]
    tags = {t for (t,) in q(f"SELECT DISTINCT tag FROM monitor {where}")}
    assert {
        "Train/Samples/train_loss",
        "Train/Samples/lr",
        "Train/Samples/loss_scale",
        "Train/Samples/samples_per_sec",
    } <= tags
    # what each rank trained on per step: its share of the global batch (float inputs: no tokens)
    batches = q(f"SELECT rank, step, samples, tokens FROM batches {where} ORDER BY rank, step")
    assert batches == [(r, s, BATCH // 2, None) for r in range(2) for s in range(STEPS)]
    comm = dict(q(f"SELECT log_name, count(*) FROM comm {where} AND rank = 0 GROUP BY ALL"))
    assert comm["zero2.all_gather_params"] == STEPS * BUCKETS  # one per bucket per step
    assert comm["zero.overflow"] == STEPS  # the fp16 overflow vote, once per step


def test_engine_gradient_reduce_scatter_records(run):
    q, where, _ = run
    # what each rank trained on per step: its share of the global batch (float inputs: no tokens)
    batches = q(f"SELECT rank, step, samples, tokens FROM batches {where} ORDER BY rank, step")
    assert batches == [(r, s, BATCH // 2, None) for r in range(2) for s in range(STEPS)]
    comm = dict(q(f"SELECT log_name, count(*) FROM comm {where} AND rank = 0 GROUP BY ALL"))
    assert comm.get("zero2.reduce_scatter_grads") == STEPS * 2 * BUCKETS  # per bucket per micro-batch


def test_engine_collectives_are_flight_recorders_entries_at_the_same_seq(run):
    """The bundled engine's collectives (ZeRO-2 with overlap_comm: bucketed reduce_scatter, the
    parameter all_gather, the fp16 overflow check) equal torch's Flight Recorder entries at the
    same (process group, collective_seq_id) on every rank, in op and size."""
    q, where, tmp = run
    for rank in range(2):
        rows = q(f"SELECT group_name, seq, op, numel FROM comm {where} AND rank = {rank}")
        rows = [dict(zip(("group_name", "seq", "op", "numel"), r, strict=True)) for r in rows]
        assert rows, f"rank {rank}: no comm rows"
        problems = flight_recorder.mismatches(rows, flight_recorder.load(tmp, rank))
        assert problems == [], (rank, problems[:5], len(problems), len(rows))
