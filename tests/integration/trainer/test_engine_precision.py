"""fp16 loss scaling across ranks (injected overflow: skip, back off, name the parameter and
the rank), static scale, and bf16, on 2 gloo ranks."""

from __future__ import annotations

import math

import torch

import trainer
from tests._engine_util import engine_config, make_model, num_params, spawn, train

BATCH, OVERFLOW_STEP, BAD_RANK, BAD_PARAM = 8, 3, 1, "2.weight"


def _fp16_config(**fp16) -> dict:
    cfg = engine_config(stage=2, batch=BATCH, gas=1, clip=1.0)
    cfg["fp16"] = dict(
        {"enabled": True, "auto_cast": True, "initial_scale_power": 8, "hysteresis": 1, "loss_scale_window": 1000},
        **fp16,
    )
    return cfg


def _overflow_run(rank, world, config):
    model = make_model()
    engine, *_ = trainer.initialize(model=model, config=config)
    inject = {"on": False}
    if rank == BAD_RANK:
        param = dict(model.named_parameters())[BAD_PARAM]
        param.register_hook(lambda g: torch.full_like(g, math.inf) if inject["on"] else g)
    records, snapshots = [], []
    for step in range(6):
        inject["on"] = step == OVERFLOW_STEP
        before = [p.detach().clone() for p in model.parameters()]
        train(engine, steps=1, batch=BATCH, start=step)
        snapshots.append(all(torch.equal(a, p) for a, p in zip(before, model.parameters())))
        records.append(engine.last_records["loss_scale"][0])
    return {
        "records": records,
        "unchanged": snapshots,
        "skipped": engine.skipped_steps,
        "dtype": str(next(model.parameters()).dtype),
        "memory": {r["kind"]: r["bytes"] for r in engine.last_records["memory"]},
    }


def _bf16_run(rank, world):
    engine, *_ = trainer.initialize(
        model=make_model(), config=dict(engine_config(stage=3, batch=BATCH, gas=2), bf16={"enabled": True})
    )
    losses = train(engine, steps=15, batch=BATCH)
    return {
        "losses": losses,
        "dtype": str(next(engine.module.parameters()).dtype),
        "master": str(engine.optimizer.master.masters[0].dtype),
    }


def _all_runs(rank, world):
    return {
        "dynamic": _overflow_run(rank, world, _fp16_config()),
        "static": _overflow_run(rank, world, _fp16_config(loss_scale=128)),
        "bf16": _bf16_run(rank, world),
    }


def test_engine_precision(tmp_path):
    results = spawn(_all_runs, 2, tmp_path)
    for _rank, res in enumerate(results):
        dyn = res["dynamic"]
        assert dyn["dtype"] == "torch.float16"
        for step, rec in enumerate(dyn["records"]):
            if step == OVERFLOW_STEP:
                assert rec["overflow"] and rec["scale"] == rec["scale_before"] / 2
                assert BAD_PARAM in rec["bad_params"].split(","), rec
                assert rec["first_rank"] == BAD_RANK
                assert dyn["unchanged"][step], "an overflowing step must not touch the weights"
            else:
                assert not rec["overflow"] and rec["bad_params"] == "" and rec["first_rank"] == -1
                assert not dyn["unchanged"][step]
        assert dyn["records"][0]["scale_before"] == 2.0**8
        # ZeRO-2 with fp16 on 2 ranks: fp16 params 2Ψ; fp32 gradient shards 4Ψ/2 (accumulated in fp32,
        # where the paper counts fp16); fp32 master + Adam moments 12Ψ/2 (the paper's K = 12).
        psi = num_params()
        for kind, want in {"params": 2 * psi, "grads": 4 * psi / 2, "optimizer": 12 * psi / 2}.items():
            assert abs(dyn["memory"][kind] - want) <= 0.05 * want, (kind, dyn["memory"][kind], want)
        assert dyn["skipped"] == 1
        static = res["static"]
        assert [r["scale"] for r in static["records"]] == [128.0] * 6
        assert static["records"][OVERFLOW_STEP]["overflow"] and static["unchanged"][OVERFLOW_STEP]
        assert static["skipped"] == 1
        bf16 = res["bf16"]
        assert bf16["dtype"] == "torch.bfloat16" and bf16["master"] == "torch.float32"
        assert all(math.isfinite(x) for x in bf16["losses"]) and bf16["losses"][-1] < bf16["losses"][0]
