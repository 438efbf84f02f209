"""A collector that cannot be reached, seen from a real training process (``python -m collector.hook``):
training goes on, the rank says so once, early (a few seconds in, naming the endpoint and the spool
dir), and exits about as fast as with a collector, the records spooled (it used to say nothing until
exit and then wait close_timeout_s, 5 s, for acks that could not come)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from collector.rank import spool
from collector.rank.client import UNREACHABLE_WARN_S
from collector.testing.collectors import live_collector
from collector.testing.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
TRAIN_S = 6.0
HOOK = [sys.executable, "-m", "collector.hook"]

SCRIPT = """\
import sys, time, torch, torch.distributed as dist
from collector import hook
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
print("start", flush=True)
t0 = time.monotonic()
while time.monotonic() - t0 < float(sys.argv[2]):
    dist.all_reduce(torch.ones(64))
    hook.log({"loss": 1.0})
    time.sleep(0.01)
dist.destroy_process_group()
print("done", flush=True)
t0 = time.monotonic()
hook.detach()  # what the end of the script does anyway (python -m collector.hook), timed
print(f"detach {time.monotonic() - t0:.3f}", flush=True)
"""


def train(endpoint: str, tmp: Path) -> tuple[int, list[tuple[float, str, str]]]:
    """Runs the script attached: its exit code, and every output line with when it came."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "train.py").write_text(SCRIPT)
    env = dict(os.environ, RANKSCOPE_SPOOL_DIR=str(tmp / "spool"), WORLD_SIZE="1", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*HOOK, "--endpoint", endpoint, "--run-name", "away", str(tmp / "train.py"), str(tmp / "store"), str(TRAIN_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    lines: list[tuple[float, str, str]] = []

    def pump(stream, tag):
        for line in stream:
            lines.append((time.monotonic() - t0, tag, line.rstrip()))

    pumps = [threading.Thread(target=pump, args=(s, tag)) for s, tag in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for t in pumps:
        t.start()
    rc = proc.wait(timeout=120)
    for t in pumps:
        t.join()
    return rc, lines


def _at(lines, text: str) -> float:
    return next(t for t, tag, line in lines if tag == "out" and line == text)


def test_an_unreachable_collector_is_reported_once_early_and_the_exit_stays_prompt(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    rc, lines = train(endpoint, tmp_path)
    err = [(t, line) for t, tag, line in lines if tag == "err"]
    assert rc == 0, err
    start, done = _at(lines, "start"), _at(lines, "done")
    early = [(t, line) for t, line in err if "has not answered" in line]
    assert len(early) == 1, err  # once
    when, text = early[0]
    assert endpoint in text and str(tmp_path / "spool") in text
    # a few seconds after the first failed send, while the script is still training
    assert UNREACHABLE_WARN_S - 0.5 <= when - start and when < done, (start, when, done)
    # the exit does not wait close_timeout_s (5 s) for acks that cannot come: detach took >= 5 s
    (detach,) = [float(line.split()[1]) for _, tag, line in lines if tag == "out" and line.startswith("detach ")]
    assert detach < 2.5, detach
    assert spool.files(tmp_path / "spool"), "the records are spooled"


def test_with_a_collector_nothing_is_reported(tmp_path):
    with live_collector(tmp_path / "data") as (endpoint, _):
        rc, lines = train(endpoint, tmp_path)
    err = [line for _, tag, line in lines if tag == "err"]
    assert rc == 0 and not [line for line in err if "rankscope" in line], err
