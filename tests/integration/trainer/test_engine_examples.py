"""The examples run as users run them: torchrun with a shipped config, per-step loss printed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from collector.tools.launch import torchrun_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _torchrun(module: str, config: str, steps: int, nproc: int = 2, *extra: str, env: dict | None = None) -> str:
    cmd = torchrun_command(
        nproc,
        "-m",
        module,
        "--config",
        os.path.join(ROOT, "trainer", "examples", "configs", config),
        "--steps",
        str(steps),
        *extra,
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _losses(out: str, name: str) -> list[float]:
    return [float(x) for x in re.findall(rf"\[{name}\] step \d+ loss ([0-9.]+)", out)]


def test_engine_example_gpt_zero3_two_ranks(tmp_path):
    out = _torchrun(
        "trainer.examples.gpt", "zero3.json", 12, 2, "--run-name", "example-test", "--save", str(tmp_path / "ckpt")
    )
    losses = _losses(out, "gpt")
    assert len(losses) == 12 and losses[-1] < losses[0]
    assert "time (ms) | fwd:" in out  # wall_clock_breakdown printed at steps_per_print
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step12"


def test_engine_example_bert_fp16_single_process():
    cmd = [
        sys.executable,
        "-m",
        "trainer.examples.bert",
        "--config",
        os.path.join(ROOT, "trainer", "examples", "configs", "fp16.json"),
        "--steps",
        "5",
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_losses(proc.stdout, "bert")) == 5


def test_engine_example_bad_config_path_is_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.examples.gpt", "--config", "/nonexistent.json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "cannot read --config /nonexistent.json" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_bad_config_value_under_torchrun_is_one_line_naming_the_key(tmp_path):
    """ZeRO stage 4 under a plain torchrun: the rank says the key, what is allowed and what it got in
    one line and exits 2, no traceback (torchrun's own ChildFailedError report after it is torch's)."""
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 4}}))
    logs = tmp_path / "logs"
    cmd = torchrun_command(1, "--log-dir", str(logs), "--redirects", "3", "-m", "trainer.examples.gpt")
    cmd += ["--config", str(config), "--steps", "1"]
    env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_DEBUG"}
    proc = subprocess.run(
        cmd, cwd=ROOT, env=dict(env, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "exitcode  : 2" in proc.stderr, proc.stderr[-3000:]  # torchrun's report of the rank's exit
    (rank_stderr,) = logs.rglob("stderr.log")  # what the rank itself printed
    said = rank_stderr.read_text()
    line = "error: zero_optimization.stage: must be one of 0, 1, 2, 3 (got 4) (RANKSCOPE_DEBUG=1 shows the traceback)"
    assert said.strip() == line, said


def _comm_rows(data, run: str, sql_where: str) -> list[tuple]:
    """(rank, group_name, group_size, log_name, count) of the run's comm rows matching ``sql_where``."""
    from collector.data import catalog

    con = catalog.connect(data)
    try:
        (run_id,) = con.execute("SELECT run_id FROM runs WHERE name = ?", [run]).fetchone()
        return con.execute(
            f"""SELECT rank, group_name, group_size, log_name, count(*) FROM comm
                               WHERE run_id = ? AND {sql_where} GROUP BY ALL ORDER BY ALL""",
            [run_id],
        ).fetchall()
    finally:
        con.close()


# Four ranks split two ways: each rank's group of neighbours ([0,1] / [2,3]) and of strided peers ([0,2] / [1,3]),
# named by the role the engine made them for (tp, dp, ep, edp: schema.group_name).
PAIRS = {0: "[0-1]", 1: "[0-1]", 2: "[2-3]", 3: "[2-3]"}
STRIDED = {0: "[0,2]", 1: "[1,3]", 2: "[0,2]", 3: "[1,3]"}


def _train_gpt_on_four_ranks(endpoint: str, run: str, *flags: str) -> None:
    """The GPT example, 10 ZeRO-2 steps on 4 ranks with ``flags``, streamed as ``run``; its loss falls."""
    out = _torchrun(
        "trainer.examples.gpt", "zero2.json", 10, 4, "--run-name", run, *flags, env={"RANKSCOPE_ENDPOINT": endpoint}
    )
    losses = _losses(out, "gpt")
    assert len(losses) == 10 and losses[-1] < losses[0] - 0.1, losses


def test_engine_example_gpt_moe_ep2_four_ranks_records_expert_groups(live_collector):
    """--moe --ep-size 2 on 4 ranks: experts all_to_all over the expert-parallel groups [0,1] / [2,3],
    expert gradients reduce over the expert-data-parallel groups [0,2] / [1,3], dense ones over the world."""
    endpoint, data = live_collector
    _train_gpt_on_four_ranks(endpoint, "gpt-moe", "--moe", "--ep-size", "2", "--top-k", "2")
    a2a = _comm_rows(data, "gpt-moe", "op = 'all_to_all_single'")
    # one MoE block: dispatch, the fill counts and combine per forward, the reverses in backward, every step
    assert sorted({(r, g, n, name) for r, g, n, name, _ in a2a}) == sorted(
        (r, "ep" + PAIRS[r], 2, name)
        for r in range(4)
        for name in ("moe.dispatch", "moe.fill_counts", "moe.combine", "moe.dispatch.backward", "moe.combine.backward")
    )
    assert all(count >= 10 for *_, count in a2a), a2a
    grads = _comm_rows(data, "gpt-moe", "log_name LIKE 'zero2.%_grads'")
    assert {(r, g, n) for r, g, n, *_ in grads} == {
        (r, g, n) for r in range(4) for g, n in (("edp" + STRIDED[r], 2), ("world", 4))
    }


def test_engine_example_gpt_tp2_four_ranks_records_tp_groups(live_collector):
    """--tp 2 on 4 ranks: activations all_reduce over the tensor-parallel groups [0,1] / [2,3],
    ZeRO gradients over the data-parallel groups [0,2] / [1,3]."""
    endpoint, data = live_collector
    _train_gpt_on_four_ranks(endpoint, "gpt-tp", "--tp", "2")
    tp = _comm_rows(data, "gpt-tp", "op = 'all_reduce' AND log_name LIKE 'tp.%'")
    assert sorted({(r, g, n, name) for r, g, n, name, _ in tp}) == sorted(
        (r, "tp" + PAIRS[r], 2, name) for r in range(4) for name in ("tp.copy_to_tp.backward", "tp.reduce_from_tp")
    )
    grads = _comm_rows(data, "gpt-tp", "log_name LIKE 'zero2.%_grads'")
    assert {(r, g, n) for r, g, n, *_ in grads} == {(r, "dp" + STRIDED[r], 2) for r in range(4)}
