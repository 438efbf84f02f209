"""``python -m collector.hook`` as the README shows it: the README's own torchrun command line,
run as written (2 gloo ranks, a tiny script), reaches a real collector under the name it gives."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from collector.data import catalog
from collector.testing.collectors import live_collector
from collector.testing.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent

TRAIN = """\
import argparse, torch, torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
lr = p.parse_args().lr
dist.init_process_group("gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(8) * lr)
dist.destroy_process_group()
"""


def readme_hook_command() -> list[str]:
    """The README's "without editing it" command line, split as a shell would."""
    commands = re.findall(r"`(torchrun [^`]*-m collector\.hook [^`]*)`", (ROOT / "README.md").read_text())
    assert len(commands) == 1, commands
    return shlex.split(commands[0])


def test_the_readme_torchrun_command_runs_attached_under_its_run_name(tmp_path):
    argv = readme_hook_command()
    assert argv[0] == "torchrun" and "train.py" in argv
    (tmp_path / "train.py").write_text(TRAIN)
    with live_collector(tmp_path / "data") as (endpoint, data_dir):
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            RANKSCOPE_ENDPOINT=endpoint,
            RANKSCOPE_SPOOL_DIR=str(tmp_path / "spool"),
            PET_MASTER_PORT=str(free_port()),  # torchrun's --master-port, by env: the command stays as written
            OMP_NUM_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
        )
        env.pop("RANKSCOPE_RUN", None)
        done = subprocess.run(
            [str(VENV_BIN / "torchrun"), *argv[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    name = argv[argv.index("--run-name") + 1]
    con = catalog.connect(data_dir)
    try:
        runs = con.execute("SELECT name, world_size, status FROM runs").fetchall()
        ops = con.execute("SELECT rank, count(*) FROM comm WHERE op = 'all_reduce' GROUP BY rank ORDER BY rank")
        ops = ops.fetchall()
    finally:
        con.close()
    assert runs == [(name, 2, "finished")]
    assert ops == [(0, 3), (1, 3)]


def test_run_still_names_the_run_without_torchrun(tmp_path):
    """``--run`` is kept as the short spelling where torchrun is not in the way."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
        "dist.all_reduce(torch.ones(4))\n"
        "dist.destroy_process_group()\n"
    )
    with live_collector(tmp_path / "data") as (endpoint, data_dir):
        env = {**os.environ, "WORLD_SIZE": "1", "RANKSCOPE_SPOOL_DIR": str(tmp_path / "spool")}
        env.pop("RANKSCOPE_RUN", None)
        done = subprocess.run(
            [sys.executable, "-m", "collector.hook", "--endpoint", endpoint, "--run", "short", str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr[-4000:]
    con = catalog.connect(data_dir)
    try:
        assert con.execute("SELECT name FROM runs").fetchall() == [("short",)]
    finally:
        con.close()
