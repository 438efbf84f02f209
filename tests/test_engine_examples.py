"""The examples run as users run them: torchrun with a shipped config, per-step loss printed."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from _engine_util import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torchrun(module: str, config: str, steps: int, nproc: int = 2, *extra: str) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", module,
           "--config", os.path.join(ROOT, "trainer", "examples", "configs", config), "--steps", str(steps), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _losses(out: str, name: str) -> list[float]:
    return [float(x) for x in re.findall(rf"\[{name}\] step \d+ loss ([0-9.]+)", out)]


def test_engine_example_gpt_zero3_two_ranks(tmp_path):
    out = _torchrun("trainer.examples.gpt", "zero3.json", 12, 2, "--run-name", "example-test",
                    "--save", str(tmp_path / "ckpt"))
    losses = _losses(out, "gpt")
    assert len(losses) == 12 and losses[-1] < losses[0]
    assert "time (ms) | fwd:" in out  # wall_clock_breakdown printed at steps_per_print
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step12"


def test_engine_example_bert_fp16_single_process():
    cmd = [sys.executable, "-m", "trainer.examples.bert", "--config",
           os.path.join(ROOT, "trainer", "examples", "configs", "fp16.json"), "--steps", "5"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_losses(proc.stdout, "bert")) == 5


def test_engine_example_bad_config_path_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "trainer.examples.gpt", "--config", "/nonexistent.json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "cannot read --config /nonexistent.json" in proc.stderr
    assert "Traceback" not in proc.stderr
