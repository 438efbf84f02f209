"""Rank processes for the Flight Recorder import test: 3 gloo ranks with the hook attached and
torch's Flight Recorder on (TORCH_FR_BUFFER_SIZE), each dumping its Flight Recorder trace at the
end: even ranks as JSON, odd ranks as a pickle (both of torch's formats)."""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from collector import hook
from collector.rank import session
from collector.testing.gloo import torchrun_env

WORLD = 3
PG_TIMEOUT_S = 10  # the waiting ranks' collective fails after this, and they dump
DEADLINE_S = 120


def _start(rank: int, port: int, endpoint: str, run: str) -> None:
    torchrun_env(rank, WORLD, port, TORCH_FR_BUFFER_SIZE="2000")
    torch.set_num_threads(1)
    hook.attach(run=run, endpoint=endpoint, hang_after_s=1.0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    client = session.active().client
    deadline = time.monotonic() + 60
    while client.acked == 0 and time.monotonic() < deadline:
        time.sleep(0.05)


def _dump(rank: int, out: str) -> None:
    c10d = torch._C._distributed_c10d
    if rank % 2:
        data, name = c10d._dump_fr_trace(True, True), f"nccl_trace_rank_{rank}"
    else:
        data, name = c10d._dump_fr_trace_json(True, True), f"fr{rank}.json"
    data = data if isinstance(data, bytes) else data.encode()
    tmp = Path(out, f".{name}")
    tmp.write_bytes(data)
    tmp.rename(Path(out, "dumps", name))


def worker(rank: int, port: int, endpoint: str, out: str, k: int, stall_rank: int) -> None:
    """k all_reduces and an all_gather_into_tensor a step; with ``stall_rank`` >= 0 that rank never
    enters the k-th step's all_reduce: the others wait in it until their process group times out."""
    _start(rank, port, endpoint, "fr-hang" if stall_rank >= 0 else "fr-healthy")
    t = torch.ones(64)
    error = None
    try:
        for step in range(1, k + 1):
            session.set_step(step)
            if step == k and rank == stall_rank:
                deadline = time.monotonic() + DEADLINE_S  # until the waiting ranks have dumped
                while len(list(Path(out, "dumps").iterdir())) < WORLD - 1 and time.monotonic() < deadline:
                    time.sleep(0.1)
                break
            dist.all_reduce(t)
            dist.all_gather_into_tensor(torch.zeros(64 * WORLD), t)
    except RuntimeError as exc:  # the process group's timeout
        error = str(exc)[:200]
    _dump(rank, out)
    hook.detach("failed" if error else "finished")
    os._exit(0)  # gloo's pairs may be broken: no clean teardown
