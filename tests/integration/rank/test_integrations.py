"""The Hugging Face Trainer and Lightning callbacks with the real packages: tiny models built from
code (nothing downloaded), 2 gloo ranks under torchrun, a real collector. The steps in the catalog
are the frameworks' own global_step, and what they logged is in ``monitor`` at that step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collector.data import catalog
from collector.testing import flight_recorder
from collector.testing.collectors import live_collector
from collector.testing.ports import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORLD = 2


def torchrun(script: str, out: Path) -> tuple[list[dict], Path]:
    with live_collector(out / "data") as (endpoint, data_dir):
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            RANKSCOPE_ENDPOINT=endpoint,
            HF_HUB_OFFLINE="1",
            OMP_NUM_THREADS="1",
            TORCH_FR_BUFFER_SIZE="20000",  # Flight Recorder: the oracle of collective identity
            CUDA_VISIBLE_DEVICES="",
        )
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD)]
        done = subprocess.run(
            [*launch, "--master-port", str(free_port()), str(HERE / script), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0]["run_id"] and all(r["run_id"] == ranks[0]["run_id"] for r in ranks)
    return ranks, data_dir


def _query(data_dir: Path, sql: str, params: list) -> list[tuple]:
    con = catalog.connect(data_dir)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def _assert_a_wait_before_every_step_but_the_first(data_dir: Path, run_id: str, steps: int) -> None:
    """The framework's step end (its callback) starts the wait, its next forward ends it: one
    between_steps row per rank for steps 2..steps, none left over from micro-batches."""
    rows = _query(
        data_dir, "SELECT rank, step, dur_ns FROM between_steps WHERE run_id = ? ORDER BY rank, step", [run_id]
    )
    assert [(r, s) for r, s, _ in rows] == [(r, s) for r in range(WORLD) for s in range(2, steps + 1)], rows
    assert all(0 <= d < 10**9 for *_, d in rows), rows


def _assert_flight_recorder_agrees_and_health_is_quiet(data_dir: Path, run_id: str, out: Path) -> None:
    """Every comm row is Flight Recorder's entry at the same (group, seq) on its rank (the framework's
    own collectives, e.g. the Trainer's all_gather of metrics, and DDP's buckets interleave); so a
    healthy run has no mismatch and nothing critical. A straggler warning is allowed: in these 5-6
    step runs of a tiny model, rank 0's own per-step logging is a real share of a few-ms step (the
    fault suite's longer HF/Lightning cases, benches/faults.py, score warnings on healthy runs)."""
    for rank in range(WORLD):
        rows = _query(
            data_dir, "SELECT group_name, seq, op, numel FROM comm WHERE run_id = ? AND rank = ?", [run_id, rank]
        )
        rows = [dict(zip(("group_name", "seq", "op", "numel"), r, strict=True)) for r in rows]
        assert rows and flight_recorder.mismatches(rows, flight_recorder.load(out, rank)) == [], rank
    done = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", run_id, "--data-dir", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = json.loads(done.stdout)
    assert done.returncode in (0, 1), found
    assert not [f for f in found if f["severity"] == "critical" or f["kind"] == "desync"], found
    assert all(f["kind"] == "straggler" for f in found if f["severity"] == "warning"), found


def test_huggingface_trainer(tmp_path):
    pytest.importorskip("transformers", reason="the huggingface extra (transformers) is not installed")
    from tests.integration.rank import _hf_trainer_script as script

    ranks, data_dir = torchrun("_hf_trainer_script.py", tmp_path)
    run_id = ranks[0]["run_id"]
    assert _query(data_dir, "SELECT name FROM runs WHERE run_id = ?", [run_id]) == [("hf-tiny",)]  # args.run_name
    for rank, seen in enumerate(ranks):
        assert seen["global_step"] == script.STEPS
        buckets = _query(
            data_dir,
            "SELECT step, count(*) FROM comm WHERE run_id = ? AND rank = ? AND log_name = 'ddp_bucket_all_reduce' "
            "GROUP BY step ORDER BY step",
            [run_id, rank],
        )
        assert [s for s, _ in buckets] == list(range(1, script.STEPS + 1))
        assert len({n for _, n in buckets}) == 1  # every step: the same buckets, for ACCUM micro-batches
        logged = {(e["step"], "loss"): e["loss"] for e in seen["log"] if "loss" in e}
        logged |= {(e["step"], "learning_rate"): e["learning_rate"] for e in seen["log"] if "learning_rate" in e}
        assert {s for s, _ in logged} == set(range(1, script.STEPS + 1))
        rows = _query(
            data_dir,
            "SELECT step, tag, value FROM monitor WHERE run_id = ? AND rank = ? AND tag IN ('loss', 'learning_rate')",
            [run_id, rank],
        )
        assert {(s, t): v for s, t, v in rows} == pytest.approx(logged, rel=1e-6)
    _assert_a_wait_before_every_step_but_the_first(data_dir, run_id, script.STEPS)
    _assert_flight_recorder_agrees_and_health_is_quiet(data_dir, run_id, tmp_path)


def test_lightning(tmp_path):
    pytest.importorskip("lightning", reason="the lightning extra is not installed")
    from tests.integration.rank import _lightning_script as script

    ranks, data_dir = torchrun("_lightning_script.py", tmp_path)
    run_id = ranks[0]["run_id"]
    assert _query(data_dir, "SELECT name FROM runs WHERE run_id = ?", [run_id]) == [("lightning-tiny",)]
    for rank, seen in enumerate(ranks):
        assert seen["global_step"] == script.STEPS
        steps = _query(
            data_dir,
            "SELECT DISTINCT step FROM comm WHERE run_id = ? AND rank = ? AND log_name = 'ddp_bucket_all_reduce' "
            "ORDER BY step",
            [run_id, rank],
        )
        assert [s for (s,) in steps] == list(range(1, script.STEPS + 1))
        rows = _query(
            data_dir,
            "SELECT step, value FROM monitor WHERE run_id = ? AND rank = ? AND tag = 'train_loss' ORDER BY step",
            [run_id, rank],
        )
        expected = {int(k): v for k, v in seen["last_loss"].items()}
        assert dict(rows) == pytest.approx(expected, rel=1e-6)
    _assert_a_wait_before_every_step_but_the_first(data_dir, run_id, script.STEPS)
    _assert_flight_recorder_agrees_and_health_is_quiet(data_dir, run_id, tmp_path)
