"""Ranks of a real gloo world in processes of their own, started as torchrun would start them: the
parent's side (``start_ranks`` or ``run_ranks``, ``join_ranks``, ``wait_for`` a condition meanwhile) and each rank's
(``torchrun_env`` before ``init_process_group``, ``any_rank_sees`` a stop flag, ``leave_world``)."""

from __future__ import annotations

import os
import time

from collector.testing.ports import free_port

# Ranks are forked from a server that imported torch once (multiprocessing's "forkserver"), not
# spawned: a spawned rank spends ~1.8 s of CPU importing torch (7 s a 4-rank world), which on a
# 2-core machine was much of the suite's CPU. The server forks before any thread or process group
# exists, so each rank starts as clean as a spawned one.
PRELOAD = ["torch", "torch.distributed"]


def start(fn, nprocs: int, args: tuple = (), join: bool = False):
    """``fn(i, *args)`` in ``nprocs`` processes (torch.multiprocessing.start_processes) forked from
    the server, each first given this process's environment and working directory as they are now
    (the server's were fixed when it started); with ``join``, waits and raises if one failed."""
    import multiprocessing

    import torch.multiprocessing as mp  # only here: the kit's other modules stay free of torch

    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts, the first time
    context = (dict(os.environ), os.getcwd(), fn)
    return mp.start_processes(_as_started, args=(context, *args), nprocs=nprocs, join=join, start_method="forkserver")


def _as_started(i: int, context: tuple, *args):
    env, cwd, fn = context
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    return fn(i, *args)


def start_ranks(fn, world: int, *args):
    """``fn(rank, port, *args)`` in ``world`` processes (``start``), ``port`` a free one for their
    rendezvous; returns torch.multiprocessing's ProcessContext at once."""
    return start(fn, world, (free_port(), *args))


def run_ranks(fn, world: int, *args) -> None:
    """``start_ranks``, waiting for every rank: raises if one failed."""
    start(fn, world, (free_port(), *args), join=True)


def join_ranks(ctx, timeout: float = 120.0) -> None:
    """Waits for every rank to exit (a rank that failed raises here); past ``timeout`` kills them all
    and fails."""
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise AssertionError("ranks did not finish")


def any_rank_sees(flag) -> bool:
    """Whether any rank of the world sees the file ``flag``, agreed by all with an all_reduce: ranks
    that stop on it leave after the same step. One that read it alone could leave while a peer that
    had not waited in its next collective, which then fails ("Connection closed by peer", seen in CI)."""
    import torch
    import torch.distributed as dist

    seen = torch.tensor([float(os.path.exists(flag))])
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    return bool(seen.item())


def leave_world() -> None:
    """A spawned rank's last words once its checks passed: a barrier, ``destroy_process_group``, and
    an exit that skips interpreter finalization. torch 2.13's gloo worker threads free a finished
    collective's tensors themselves, which takes the GIL when Python had already dropped them; if
    that happens while the interpreter finalizes, the thread is torn down inside C++ and the rank
    dies with SIGABRT ("terminate called without an active exception") after its work passed:
    seen in CI on the engine's MoE ranks, about one run in five here, a barrier alone did not stop it."""
    import sys

    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def stamp(path) -> None:
    """Write the time now to ``path`` whole: a test polling for the file never reads it empty."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(time.time()))
    os.replace(tmp, path)


def wait_for(predicate, timeout: float, interval: float = 0.2):
    """``predicate()``'s first value that is neither None nor False, polled every ``interval`` s; after
    ``timeout`` s whatever it returns then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got is not None and got is not False:
            return got
        time.sleep(interval)
    return predicate()


def torchrun_env(rank: int, world: int, port: int, **extra: str) -> None:
    """The environment torchrun gives ``rank`` of ``world`` on this host (env:// rendezvous at ``port``)."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    os.environ.update(extra)
