"""Rank processes for the stuck-detection tests: 3 gloo ranks with the hook attached at default
settings (no hang_after_s: 60 s). Each learns the run's normal waits (quick all_reduces and
barriers), then idles, streaming heartbeats only, until the test writes ``out/go``; then:

* ``hang``: rank 2 stops before the next all_reduce until the test writes ``out/release``;
* ``checkpoint``: rank 0 saves a checkpoint through ``torch.save`` into storage that takes
  ``SAVE_S`` s while the others wait at a barrier, as a training loop does every N steps;
* ``crash``: the test kills rank 2 before ``out/go``; the others' next all_reduce raises, and they
  end the run as failed (a script that catches the error; torchrun would stop them instead).
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from collector import hook
from collector.rank import session
from collector.testing.gloo import stamp, torchrun_env
from collector.testing.slow_storage import SlowStorage

WORLD = 3
SAVE_S = 6.0  # twice the stuck floor (hang_rule.STUCK_FLOOR_S): long enough to be judged
WAIT_S = 240  # for the test's files; then the rank gives up (the test fails by then)


def _wait_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def stall_before_collective(release: Path) -> None:
    """The named function a stuck rank is found in (its stack's innermost frame must name it)."""
    deadline = time.monotonic() + WAIT_S
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def worker(rank: int, port: int, endpoint: str, out: str, mode: str) -> None:
    out = Path(out)
    torchrun_env(rank, WORLD, port)
    torch.set_num_threads(1)
    hook.attach(run=f"stuck-{mode}", endpoint=endpoint)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=WAIT_S))
    client = session.active().client
    deadline = time.monotonic() + 60
    while client.acked == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    c10d.barrier()
    model = torch.nn.Linear(64, 64)
    for i in range(40):  # the normal waits, learned by the collector from these comm rows
        t = torch.ones(4)
        dist.all_reduce(t)
        if i % 4 == 0:
            dist.barrier()
        time.sleep(0.01)
    (out / f"learned{rank}").write_text("")
    _wait_file(out / "go")
    stamp(out / f"entered{rank}")
    if mode == "crash":
        try:
            dist.all_reduce(torch.ones(4))
        except RuntimeError:
            stamp(out / f"done{rank}")
            hook.detach("failed")
            return
    elif mode == "hang":
        if rank == 2:
            stall_before_collective(out / "release")
        dist.all_reduce(torch.ones(4))
    else:
        if rank == 0:
            torch.save({"model": model.state_dict()}, SlowStorage(SAVE_S))
        dist.barrier()
    stamp(out / f"done{rank}")
    _wait_file(out / "finish")  # the test looks at the run after the collective, streams still open
    hook.detach()
    dist.destroy_process_group()
