"""ZeRO-Infinity style offload to files (offload_optimizer.device "nvme", stages 1-3, and
offload_param.device "nvme", stage 3) on 2 gloo ranks: same losses as CPU offload, swap files really used
and removed at close, swap phases in telemetry, checkpoints through swapped state, bad nvme_path / aio values fail at
initialize naming the key; and CPU offload running native.CPUAdam still matches torch."""

from __future__ import annotations

import os

import pytest

import trainer
from tests._engine_util import engine_config, make_model, reference_losses, spawn, train

STEPS, BATCH, CLIP = 20, 16, 0.05
TOL = 1e-6  # nvme vs cpu offload: same optimizer, state round-trips through files bit-exact
RTOL = 1e-5  # vs single-process torch.optim.AdamW, as test_engine_zero


def _offload(device: str, path: str | None = None) -> dict:
    return {"device": device, "nvme_path": path} if device == "nvme" else {"device": device}


def _engine(stage: int, device: str, path: str | None = None, **extra):
    zero = {"offload_optimizer": _offload(device, path)}
    if stage == 3:  # parameter partitions follow the optimizer: cpu, or files too
        zero.update(offload_param=_offload(device, path), stage3_prefetch_bucket_size=3000)
    cfg = engine_config(stage=stage, batch=BATCH, gas=2, clip=CLIP, **zero)
    cfg.update(extra)
    engine, *_ = trainer.initialize(model=make_model(), config=cfg)
    return engine


def _worker(rank, world, root):
    from collector.rank import session

    rows = []
    real_emit = session.emit
    session.emit = lambda table, **row: rows.append((table, row)) if table == "timers" else real_emit(table, **row)
    out = {}
    try:
        for stage in (1, 2, 3):
            path = os.path.join(root, f"stage{stage}")
            cpu = _engine(stage, "cpu")
            out[f"cpu{stage}"] = train(cpu, steps=STEPS, batch=BATCH)
            out[f"cpu{stage}_optimizer"] = type(cpu.optimizer.master.optimizer).__name__
            cpu.close()
            nvme = _engine(stage, "nvme", path, aio={"block_size": 4096, "queue_depth": 4, "intra_op_parallelism": 2})
            out[f"nvme{stage}"] = train(nvme, steps=STEPS, batch=BATCH)
            mine = [d for d in os.listdir(path) if d.startswith(f"rankscope-rank{rank}-")]
            files = [f for d in mine for _, _, fs in os.walk(os.path.join(path, d)) for f in fs]
            out[f"nvme{stage}_files"] = (len(mine), len(files))
            out[f"nvme{stage}_resident"] = sum(u.param_shard.numel() for u in getattr(nvme.optimizer, "units", []))
            out[f"nvme{stage}_state_bytes"] = sum(
                t.numel()
                for t in nvme.optimizer.master.optimizer.state[nvme.optimizer.master.masters[0]].values()
                if hasattr(t, "dim") and t.dim() > 0
            )
            nvme.close()
            import torch.distributed as dist

            dist.barrier()
            out[f"nvme{stage}_left"] = os.listdir(path)

        # checkpoint through swapped state: save at STEPS/2, resume in a fresh nvme engine
        for stage in (2, 3):
            path, ckpt = os.path.join(root, "ckpt_swap"), os.path.join(root, f"ckpt{stage}")
            a = _engine(stage, "nvme", path)
            train(a, steps=STEPS // 2, batch=BATCH)
            a.save_checkpoint(ckpt, tag="t")
            a.close()
            b = _engine(stage, "nvme", path)
            b.load_checkpoint(ckpt, tag="t")
            out[f"resumed{stage}"] = train(b, steps=STEPS // 2, batch=BATCH, start=STEPS // 2)
            b.close()

        # bf16 stage 3 with cpu partitions: CPUAdam writes them in its fused copy-out; same as torch's AdamW
        for name, params in (("fused", {"lr": 1e-2}), ("torch", {"lr": 1e-2, "torch_adam": True})):
            e = _engine(3, "cpu", bf16={"enabled": True}, optimizer={"type": "AdamW", "params": params})
            out[f"bf16_{name}_uses_fused"] = e.optimizer.master._fused_copy_targets() is not None
            out[f"bf16_{name}"] = train(e, steps=5, batch=BATCH)
            e.close()

        # SGD keeps torch's optimizer under offload
        sgd = _engine(2, "cpu", optimizer={"type": "SGD", "params": {"lr": 0.01}})
        out["sgd_optimizer"] = type(sgd.optimizer.master.optimizer).__name__
        sgd.close()
    finally:
        session.emit = real_emit
    out["timers"] = sorted({r["name"] for _, r in rows if r.get("name", "").startswith("nvme.")})
    out["timers_ok"] = all(r["dur_ns"] >= 0 and r["start_ns"] > 0 for _, r in rows)
    return out


def _close(got, want, tol, what):
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= tol * abs(b), f"{what} step={step}: {a} vs {b}"


def test_engine_nvme_offload_matches_cpu_offload_and_cleans_up(tmp_path):
    root = tmp_path / "nvme"
    root.mkdir()
    results = spawn(_worker, 2, tmp_path / "out", str(root))
    ref = reference_losses(STEPS, BATCH, CLIP)
    for rank, res in enumerate(results):
        for stage in (1, 2, 3):
            _close(res[f"nvme{stage}"], res[f"cpu{stage}"], TOL, f"stage {stage} nvme vs cpu rank={rank}")
            # CPU offload runs native.CPUAdam and still matches torch.optim.AdamW
            assert res[f"cpu{stage}_optimizer"] == "CPUAdam"
            _close(res[f"cpu{stage}"], ref, RTOL, f"stage {stage} cpu offload (CPUAdam) vs torch rank={rank}")
            dirs, files = res[f"nvme{stage}_files"]
            assert dirs == (2 if stage == 3 else 1) and files >= 2, (
                f"stage {stage} rank={rank}: swap files {res[f'nvme{stage}_files']}"
            )
            assert res[f"nvme{stage}_state_bytes"] == 0, "state must be parked in files between steps"
            assert res[f"nvme{stage}_left"] == [], f"stage {stage}: left after close: {res[f'nvme{stage}_left']}"
        for stage in (2, 3):
            _close(
                res[f"resumed{stage}"],
                res[f"nvme{stage}"][STEPS // 2 :],
                TOL,
                f"stage {stage} nvme checkpoint resume rank={rank}",
            )
        assert res["nvme3_resident"] == 0, "stage 3 parameter partitions must be parked in files between steps"
        assert res["sgd_optimizer"] == "SGD"
        assert res["bf16_fused_uses_fused"] and not res["bf16_torch_uses_fused"]
        _close(res["bf16_fused"], res["bf16_torch"], 1e-3, f"bf16 fused copy-out vs torch AdamW rank={rank}")
        assert res["timers"] == ["nvme.param_swap_in", "nvme.param_swap_out", "nvme.swap_in", "nvme.swap_out"]
        assert res["timers_ok"]
    assert os.listdir(root / "ckpt_swap") == []


def _nvme_cfg(path, **extra):
    return dict(
        {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
            "telemetry": {"enabled": False},
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": path}},
        },
        **extra,
    )


def test_engine_nvme_bad_path_fails_at_initialize(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    key = "zero_optimization.offload_optimizer.nvme_path"
    for path in (str(a_file), str(a_file / "sub")):  # a file; a directory that cannot be created
        with pytest.raises(ValueError) as err:
            trainer.initialize(model=make_model(), config=_nvme_cfg(path))
        assert key in str(err.value) and path in str(err.value), str(err.value)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ValueError, match=key):
            trainer.initialize(model=make_model(), config=_nvme_cfg(str(ro)))
    cfg = _nvme_cfg(None)
    with pytest.raises(ValueError, match=f"{key}: device 'nvme' needs nvme_path"):
        trainer.initialize(model=make_model(), config=cfg)
    with pytest.raises(ValueError, match=r"aio\.queue_depth: must be >= 1"):
        trainer.initialize(model=make_model(), config=_nvme_cfg(str(tmp_path), aio={"queue_depth": 0}))
    with pytest.raises(ValueError, match=r"aio\.single_submit: must be true or false"):
        trainer.initialize(model=make_model(), config=_nvme_cfg(str(tmp_path), aio={"single_submit": "no"}))
    with pytest.raises(ValueError, match=r"zero_optimization\.offload_param\.nvme_path: .*is not a directory"):
        trainer.initialize(
            model=make_model(),
            config=_nvme_cfg(
                str(tmp_path),
                zero_optimization={"stage": 3, "offload_param": {"device": "nvme", "nvme_path": str(a_file)}},
            ),
        )
    with pytest.raises(ValueError, match=r"zero_optimization\.offload_param\.nvme_path: device 'nvme' needs"):
        trainer.initialize(
            model=make_model(),
            config=_nvme_cfg(str(tmp_path), zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}}),
        )
    assert set(os.listdir(tmp_path)) <= {"a_file", "ro"}  # nothing left behind by the failed starts
