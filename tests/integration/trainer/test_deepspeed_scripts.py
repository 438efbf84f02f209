"""DeepSpeed scripts run unchanged on the engine: the corpus in deepspeed_scripts/ runs with real
DeepSpeed 0.19.8 (its own venv, benches/_deepspeed_venv.py) and with ``import trainer as
deepspeed``, 2 gloo ranks each, and every value a script observed must match.

Tolerances: losses, learning rates, momenta and gradient norms within 1e-4 (relative, or absolute
below 1): the two engines add the same fp32 numbers in other orders, and Adam on a tiny model
amplifies that over steps -- DeepSpeed's ZeRO-1 drifts from the single-process torch reference by
~1e-5 relative in five steps, while the engine matches that reference to 1e-6 (checked here too).
Step counts, flags, batch sizes and client_state exactly.

One torchrun job per engine runs the whole corpus (run_corpus.py), so DeepSpeed's import and
process start are paid once; both jobs run once per test module.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benches import _deepspeed_venv
from collector.testing.ports import free_port

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "deepspeed_scripts"
sys.path.insert(0, str(CORPUS))
from run_corpus import SCRIPTS  # noqa: E402

TOLERANCE = 1e-4
WORLD = 2
TIMEOUT_S = 900  # per engine; two cores shared with other jobs: generous
pytestmark = pytest.mark.timeout(2 * TIMEOUT_S + 120)  # the first test runs both engines' jobs


def _deepspeed_python() -> Path:
    have = _deepspeed_venv.versions()
    if not have or have["deepspeed"] != _deepspeed_venv.DEEPSPEED:
        pytest.skip(
            f"DeepSpeed {_deepspeed_venv.DEEPSPEED} is not in {_deepspeed_venv.VENV} (found {have}); create it with "
            "`python -m benches._deepspeed_venv` (make test and make ds-venv do, when the network allows)"
        )
    return _deepspeed_venv.PYTHON


def _run(engine: str, python: Path, out: Path, env: dict) -> None:
    cmd = [
        str(python),
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={WORLD}",
        f"--master_port={free_port()}",
        str(CORPUS / "run_corpus.py"),
        "--engine",
        engine,
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=CORPUS)
    errors = sorted(out.glob("*.error")) if out.exists() else []
    if proc.returncode != 0 or errors:
        details = "\n".join(f"--- {e.name}\n{e.read_text()[-3000:]}" for e in errors) or proc.stderr[-6000:]
        pytest.fail(f"the corpus failed on {engine} (exit {proc.returncode}):\n{details}")


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """``{engine: {"<script>.rank<R>": what it reported}}`` for both engines."""
    python = _deepspeed_python()
    root = tmp_path_factory.mktemp("deepspeed_scripts")
    _run("deepspeed", python, root / "deepspeed", _deepspeed_venv.env())
    # Telemetry goes to a port nobody listens on (it spools): never to a collector that happens to run here.
    ours = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        RANKSCOPE_SPOOL_DIR=str(root / "spool"),
        RANKSCOPE_ENDPOINT=f"127.0.0.1:{free_port()}",
    )
    ours["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[2]), ours.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    _run("rankscope", Path(sys.executable), root / "rankscope", ours)
    return {
        engine: {p.stem: json.loads(p.read_text()) for p in sorted((root / engine).glob("*.json"))}
        for engine in ("deepspeed", "rankscope")
    }


def differences(ours, theirs, path: str = "") -> list[str]:
    """Every place where ``ours`` and ``theirs`` differ: floats beyond TOLERANCE, anything else at all."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        out = [f"{path}.{k}: only in one engine" for k in sorted(set(ours) ^ set(theirs))]
        for k in sorted(set(ours) & set(theirs)):
            out += differences(ours[k], theirs[k], f"{path}.{k}")
        return out
    if isinstance(theirs, list) and isinstance(ours, list):
        if len(ours) != len(theirs):
            return [f"{path}: {len(ours)} items here, {len(theirs)} with DeepSpeed"]
        return [d for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(theirs, float) or isinstance(ours, float):
        ok = (
            isinstance(ours, (int, float))
            and isinstance(theirs, (int, float))
            and math.isclose(ours, theirs, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
        )
        return [] if ok else [f"{path}: {ours!r} here, {theirs!r} with DeepSpeed"]
    return [] if ours == theirs else [f"{path}: {ours!r} here, {theirs!r} with DeepSpeed"]


def test_the_comparison_catches_a_difference_beyond_the_tolerance():
    assert differences({"losses": [1.0, 2.0]}, {"losses": [1.0, 2.00005]}) == []
    assert differences({"losses": [1.0, 2.0]}, {"losses": [1.0, 2.001]}) == [
        ".losses[1]: 2.0 here, 2.001 with DeepSpeed"
    ]
    assert differences({"losses": [15.0]}, {"losses": [15.0012]}) == []  # relative 8e-5
    assert differences({"losses": [15.0]}, {"losses": [15.002]}) == [".losses[0]: 15.0 here, 15.002 with DeepSpeed"]
    assert differences({"steps": 3}, {"steps": 4}) == [".steps: 3 here, 4 with DeepSpeed"]
    assert differences({"a": 1}, {"b": 1}) == [".a: only in one engine", ".b: only in one engine"]
    assert differences({"s": {"epoch": 1}}, {"s": {"epoch": 1, "x": 2}}) == [".s.x: only in one engine"]


@pytest.mark.parametrize("script", [Path(s).stem for s in SCRIPTS])
def test_script_observes_the_same_on_both_engines(observed, script):
    for rank in range(WORLD):
        key = f"{script}.rank{rank}"
        assert key in observed["deepspeed"] and key in observed["rankscope"], f"{key} reported nothing"
        diff = differences(observed["rankscope"][key], observed["deepspeed"][key])
        assert not diff, f"{key} differs from DeepSpeed:\n" + "\n".join(diff)


def test_the_corpus_observations_are_what_the_scripts_set_up(observed):
    """Not only equal to DeepSpeed: the values the corpus exists to check hold as such."""
    ours = observed["rankscope"]
    ckpt = ours["tagged_checkpoints.rank1"]
    best = ours["tagged_checkpoints.rank0"]["losses"][2]  # rank 0 writes client_state; every rank reads it back
    assert ckpt["client_state_epoch1"] == {"epoch": 1, "best_loss": best, "note": "after 3"}
    assert ckpt["client_state_latest"] == {"epoch": 2, "history": [1, 2, 3]}
    assert ckpt["global_steps"] == [3, 5, 6]
    assert ckpt["resumed_from_epoch1"] == pytest.approx(ckpt["expected_from_epoch1"], abs=1e-6)
    assert ckpt["resumed_from_latest"] == pytest.approx(ckpt["expected_from_latest"], abs=1e-6)
    assert ckpt["eval_loss"][0] == pytest.approx(ckpt["eval_loss"][1], abs=1e-6)  # save_16bit_model
    assert ckpt["lr_after_load"] == pytest.approx([0.01 * 0.8**3])  # the client scheduler's state came back

    gas = ours["grad_accumulation.rank0"]
    assert gas["gas"] == 4 and gas["boundary"] == [False, False, False, True] * 3
    assert gas["step_applied"] == gas["boundary"] and gas["global_steps"] == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]

    sched = ours["client_scheduler.rank0"]  # StepLR(step_size=2, gamma=0.5), 2 micro-steps per step
    assert [lr for (lr,) in sched["last_lr"]] == pytest.approx([0.02, 0.01, 0.01, 0.005, 0.005])
    assert ours["args_config.rank1"]["local_rank"] == 1
    warmup = [lr for (lr,) in ours["args_config.rank0"]["lr"]]  # WarmupLR, linear over 4 steps, read after each step
    assert warmup == pytest.approx([0.0, 0.00125, 0.0025, 0.00375, 0.005, 0.005])
    losses = ours["client_optimizer.rank0"]["losses"]
    assert losses[-1] < losses[0]


def _torch_reference(make_optimizer, make_scheduler=None, steps: int = 5, clip: float = 1.0) -> list[list[float]]:
    """Per-rank losses of one process training on both ranks' batches with plain torch."""
    import torch
    import torch.nn.functional as F
    from _corpus import batch, tiny_model

    model = tiny_model()
    optimizer = make_optimizer(model.parameters())
    scheduler = make_scheduler(optimizer) if make_scheduler else None
    losses = [[] for _ in range(WORLD)]
    for step in range(steps):
        optimizer.zero_grad()
        for rank in range(WORLD):
            x, y = batch(step, rank, 4)
            loss = F.mse_loss(model(x), y)
            (loss / WORLD).backward()
            losses[rank].append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return losses


def test_the_engine_matches_single_process_torch(observed):
    import torch

    ours = observed["rankscope"]
    expected = {
        "client_optimizer": _torch_reference(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01)),
        "callable_scheduler": _torch_reference(
            lambda p: torch.optim.AdamW(p, lr=0.005, weight_decay=0.0),
            lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)),
        ),
    }
    for script, per_rank in expected.items():
        for rank, losses in enumerate(per_rank):
            assert ours[f"{script}.rank{rank}"]["losses"] == pytest.approx(losses, abs=1e-6), f"{script} rank {rank}"
