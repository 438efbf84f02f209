"""Rank processes for the liveness tests: 4 gloo ranks with the hook attached, each writing
what it saw to ``out/rank<r>.json``. Process groups get a short timeout (gloo's default is
30 min), so a test whose ranks fail ends in seconds."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from collector import hook
from collector.rank import session
from collector.testing.gloo import stamp, torchrun_env

WORLD = 4
PG_TIMEOUT_S = 60


def _start(rank: int, port: int, endpoint: str, run: str, hang_after_s: float, pg_timeout_s: float = PG_TIMEOUT_S):
    torchrun_env(rank, WORLD, port)
    torch.set_num_threads(1)
    hook.attach(run=run, endpoint=endpoint, hang_after_s=hang_after_s)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=pg_timeout_s))
    # The story starts once the rank's stream is up (on a loaded machine connecting takes seconds);
    # a barrier keeps the ranks in step from there (it goes through c10d: no comm record, no seq).
    client = session.active().client
    deadline = time.monotonic() + 60
    while client.acked == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    c10d.barrier()


def _finish(rank: int, out: str, **seen) -> None:
    hook.detach()
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))


def stall_before_collective(seconds: float) -> None:
    """The named function a stuck rank is found in (its stack must name it)."""
    time.sleep(seconds)


def _write_base(rank: int, out: str) -> None:
    """The world group's collective count before the loop (the session's and torch's own set-up
    collectives): a comm row's seq is the group's own number, so the loop's i-th is base + i."""
    Path(out, f"base{rank}").write_text(str(dist.group.WORLD._get_sequence_number_for_group()))


def hang_worker(rank: int, port: int, endpoint: str, out: str, k: int, stall_rank: int, stall_s: float) -> None:
    """Rank ``stall_rank`` sleeps ``stall_s`` before the k-th all_reduce; the others block inside it."""
    _start(rank, port, endpoint, "hang", hang_after_s=2.0)
    _write_base(rank, out)
    total = 0.0
    for i in range(1, k + 2):
        if i == k:
            stamp(Path(out, f"entered{rank}"))
            if rank == stall_rank:
                stall_before_collective(stall_s)
        t = torch.ones(4)
        dist.all_reduce(t)
        total += float(t.sum())
    _finish(rank, out, total=total)


def desync_worker(rank: int, port: int, endpoint: str, out: str, k: int, odd_rank: int, kind: str) -> None:
    """At the k-th collective rank ``odd_rank`` issues a different element count (kind 'numel')
    or a different op (kind 'op'); the backend then hangs, fails or garbles, all allowed."""
    _start(rank, port, endpoint, f"desync-{kind}", hang_after_s=2.0, pg_timeout_s=5)
    _write_base(rank, out)
    error = None
    try:
        for i in range(1, k + 1):
            odd = i == k and rank == odd_rank
            if odd and kind == "op":
                dist.broadcast(torch.ones(4), src=0)
            else:
                dist.all_reduce(torch.ones(8 if odd and kind == "numel" else 4))
    except RuntimeError as exc:  # what gloo makes of a mismatch
        error = str(exc)[:200]
    hook.detach("failed" if error else "finished")
    Path(out, f"rank{rank}.json").write_text(json.dumps({"error": error}))
    os._exit(0)  # gloo's pairs may be broken: do not wait on a clean teardown


def steady_worker(rank: int, port: int, endpoint: str, out: str, steps: int, compute_s: float) -> None:
    """A healthy loop: ``compute_s`` of work between collectives; writes its pid first so a test
    can stop or kill it, and stops early when any rank sees ``out/stop``. A peer that dies makes the
    collective fail: the rank then ends the run as failed."""
    _start(rank, port, endpoint, "steady", hang_after_s=2.0)
    Path(out, f"pid{rank}").write_text(str(os.getpid()))
    error, step = None, 0
    try:
        for step in range(1, steps + 1):
            session.set_step(step)
            time.sleep(compute_s)
            # the step's all_reduce also carries whether any rank sees out/stop, so all leave after
            # the same one: a rank that read the flag alone could leave while a peer that had not
            # waited in its next all_reduce ("Connection closed by peer")
            values = torch.ones(4)
            values[3] = float(Path(out, "stop").exists())
            dist.all_reduce(values)
            if values[3] > 0:
                break
    except RuntimeError as exc:
        error = str(exc)[:200]
    hook.detach("failed" if error else "finished")
    Path(out, f"rank{rank}.json").write_text(json.dumps({"steps": step, "error": error}))
    os._exit(0)


def engine_worker(rank: int, port: int, endpoint: str, out: str, steps: int, compute_s: float) -> None:
    """A healthy engine run (ZeRO-2) with ``compute_s`` of work between steps' collectives."""
    import trainer
    from tests._engine_util import engine_config, make_model, micro_batches

    torchrun_env(rank, WORLD, port)
    torch.set_num_threads(1)
    trainer.init_distributed("gloo", timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    cfg = engine_config(stage=2, batch=8, gas=1)
    cfg["telemetry"] = {"run": "healthy-engine", "endpoint": endpoint, "hang_after_s": 2.0}
    engine, *_ = trainer.initialize(model=make_model(), config=cfg)
    for step in range(steps):
        time.sleep(compute_s)
        for x, y in micro_batches(step, 8, rank, WORLD, 1):
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
    engine.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"steps": steps}))
    dist.destroy_process_group()
