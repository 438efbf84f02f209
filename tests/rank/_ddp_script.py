"""A plain DDP training script as people write it, run unchanged under the hook:

    RANKSCOPE_RUN=ddp torchrun --nproc-per-node 2 -m collector.hook _ddp_script.py OUT [SLOW_RANK:MS]

AdamW, gradient accumulation of ACCUM micro-batches with ``no_sync`` on all but the last, and the
usual ``dist.all_reduce(loss)`` to log the mean loss (``hook.log``). With ``SLOW_RANK:MS`` that rank
busy-waits MS ms before each step's first forward (a slow rank; busy, as a slow device keeps its
own time). Rank 0 writes ``OUT/times.json`` (seconds between consecutive step ends) and every rank
``OUT/fr<rank>.json`` (Flight Recorder, when ``TORCH_FR_BUFFER_SIZE`` is set).
"""

import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from collector import hook
from collector.testing import flight_recorder

STEPS, ACCUM, BATCH, WIDTH = 30, 2, 16, 256


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main(out: Path, slow: str | None) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow_rank, slow_ms = (int(x) for x in slow.split(":")) if slow else (-1, 0)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 10)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    ends = []
    for _ in range(STEPS):
        if rank == slow_rank:
            busy_wait(slow_ms / 1e3)
        total = torch.zeros(())
        for micro in range(ACCUM):
            x, y = torch.randn(BATCH, WIDTH, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)
            if micro < ACCUM - 1:
                with model.no_sync():
                    loss = torch.nn.functional.cross_entropy(model(x), y) / ACCUM
                    loss.backward()
            else:
                loss = torch.nn.functional.cross_entropy(model(x), y) / ACCUM
                loss.backward()
            total += loss.detach()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total)  # the mean loss over ranks, for the log
        hook.log({"loss": total.item() / dist.get_world_size()})
        ends.append(time.perf_counter())
    if os.environ.get("TORCH_FR_BUFFER_SIZE"):
        flight_recorder.dump(out)
    if rank == 0:
        (out / "times.json").write_text(json.dumps([b - a for a, b in itertools.pairwise(ends)]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
