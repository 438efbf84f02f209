"""Rank processes for the multi-process tests (started with torch.multiprocessing
spawn, gloo on CPU). Each writes what it saw to ``out/rank<r>.json``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from collector.testing.gloo import wait_for

WORLD = 4
# What every rank issues through plain torch.distributed while attached:
# op -> number of calls on rank r (sub-group and p2p ops depend on the rank).
WORLD_OPS = {
    "all_reduce": 4,  # 3 sync + 1 async
    "all_gather": 2,
    "all_gather_into_tensor": 1,
    "reduce_scatter": 1,
    "reduce_scatter_tensor": 1,
    "all_to_all": 1,
    "all_to_all_single": 1,
    "broadcast": 1,
    "reduce": 1,
    "gather": 1,
    "scatter": 1,
    "barrier": 1,
    "all_reduce_coalesced": 1,
}
SUB_RANKS = (0, 2)
SUB_ALL_REDUCES = 2
N = 4  # elements per rank's tensor
STRAGGLE_S = 0.2


def _env(rank: int, world: int, port: int) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def collectives_worker(rank: int, port: int, endpoint: str, out: str) -> None:
    """attach() before init_process_group, then a known mix of every collective."""
    from collector import hook
    from collector.rank import comm, session

    _env(rank, WORLD, port)
    active = hook.attach(run="e2e-job", endpoint=endpoint)
    assert active is not None and not active.ready  # identity waits for the process group
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    assert active.ready
    comm.configure({"enabled": True})
    session.set_step(7)
    t = torch.full((N,), float(rank + 1))
    for _ in range(3):
        dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    for _ in range(2):
        dist.all_gather([torch.empty(N) for _ in range(WORLD)], t)
    dist.all_gather_into_tensor(torch.empty(N * WORLD), t)
    dist.reduce_scatter(torch.empty(N), [torch.ones(N) for _ in range(WORLD)])
    dist.reduce_scatter_tensor(torch.empty(N), torch.ones(N * WORLD))
    dist.all_to_all([torch.empty(N) for _ in range(WORLD)], [torch.ones(N) for _ in range(WORLD)])
    dist.all_to_all_single(torch.empty(N * WORLD), torch.ones(N * WORLD))
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    dist.gather(t, [torch.empty(N) for _ in range(WORLD)] if rank == 0 else None, dst=0)
    dist.scatter(t, [torch.ones(N) for _ in range(WORLD)] if rank == 0 else None, src=0)
    dist.all_reduce_coalesced([torch.ones(N), torch.ones(2 * N)])
    if rank == 0:
        time.sleep(STRAGGLE_S)  # rank 0 arrives late: the others wait for it in the barrier
    dist.barrier()
    sub = dist.new_group(list(SUB_RANKS))
    if rank in SUB_RANKS:
        for _ in range(SUB_ALL_REDUCES):
            dist.all_reduce(torch.ones(2 * N, dtype=torch.float64), group=sub)
    # p2p: 0 -> 1 blocking, 2 -> 3 async
    if rank == 0:
        dist.send(torch.ones(N), dst=1)
    elif rank == 1:
        dist.recv(torch.empty(N), src=0)
    elif rank == 2:
        dist.isend(torch.ones(N), dst=3).wait()
    else:
        dist.irecv(torch.empty(N), src=2).wait()
    summary = comm.log_summary(show_straggler=True, return_dict=True)
    result = {"run_id": active.run_id, "summary": {k: {str(s): v for s, v in d.items()} for k, d in summary.items()}}
    hook.detach()
    assert dist.all_reduce is not comm.all_reduce  # restored
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def two_rank_worker(rank: int, port: int, endpoint: str, out: str) -> None:
    """One pair of processes for three checks (process start-up is the slow part)."""
    from collector.testing import flight_recorder

    _env(rank, 2, port)
    os.environ["TORCH_FR_BUFFER_SIZE"] = "20000"  # Flight Recorder: the oracle of collective identity
    dist.init_process_group("gloo", rank=rank, world_size=2)
    result = {"clock_offset": _clock_part(rank), "ddp_run_id": _ddp_part(rank, endpoint)}
    result.update(_fsdp_part(endpoint))
    flight_recorder.dump(out)
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def _ddp_part(rank: int, endpoint: str) -> str:
    """attach() after init_process_group; a DDP model's buckets are recorded and
    its gradients are still the average over ranks."""
    from collector import hook

    world = 2
    active = hook.attach(run="ddp-job", endpoint=endpoint)
    assert active.ready
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    reference = torch.nn.Linear(8, 3)
    reference.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    inputs = [torch.arange(16, dtype=torch.float32).reshape(2, 8) * (r + 1) / 10 for r in range(world)]
    ddp(inputs[rank]).pow(2).sum().backward()
    # reference: the mean over ranks of each rank's local gradient, computed here
    grads = []
    for r in range(world):
        reference.zero_grad()
        reference(inputs[r]).pow(2).sum().backward()
        grads.append([p.grad.clone() for p in reference.parameters()])
    for i, p in enumerate(model.parameters()):
        torch.testing.assert_close(p.grad, (grads[0][i] + grads[1][i]) / world, rtol=1e-5, atol=1e-6)
    hook.detach()
    return active.run_id


SKEW_NS = 5_000_000_000


def _clock_part(rank: int) -> int:
    """Two "hosts" (hostname faked per rank) whose clocks differ by SKEW_NS on rank 1."""
    import socket

    from collector.rank import clock

    real_time_ns, real_hostname = time.time_ns, socket.gethostname
    socket.gethostname = lambda: f"host{rank}"
    if rank == 1:
        time.time_ns = lambda: real_time_ns() + SKEW_NS
    try:
        return clock.estimate_offsets()
    finally:
        time.time_ns, socket.gethostname = real_time_ns, real_hostname


def _fsdp_part(endpoint: str) -> dict:
    """FSDP2 (fully_shard) on CPU under attach(): its collectives are recorded."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from collector import hook
    from collector.rank import comm

    comm.reset_summary()  # the summary spans the process (as DeepSpeed's); count only FSDP's ops
    active = hook.attach(run="fsdp-job", endpoint=endpoint)
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(torch.ones(3, 8)).sum().backward()
    summary = comm.log_summary(return_dict=True)
    hook.detach()
    counts = {name: sum(v["count"] for v in sizes.values()) for name, sizes in summary.items()}
    return {"fsdp_run_id": active.run_id, "fsdp_counts": counts}


def late_peer_worker(rank: int, port: int, endpoint: str, out: str) -> None:
    """Rank 1 stops its telemetry while an async all_reduce is still in flight; rank 0 joins it 0.1 s after
    it sees that rank 1 began to stop (a file: a fixed sleep after a barrier reached the stop's 1 s bound
    beside a CPU hog, and the record was dropped as designed)."""
    from collector import hook

    _env(rank, 2, port)
    hook.attach(run="late-peer", endpoint=endpoint)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.barrier()
    t = torch.full((N,), float(rank + 1))
    stop_s = None
    stopping = Path(out, "stopping")
    if rank == 0:
        wait_for(stopping.exists, 60, interval=0.01)
        time.sleep(0.1)
        dist.all_reduce(t)
        hook.detach()
    else:
        work = dist.all_reduce(t, async_op=True)
        stopping.write_text("")
        start = time.monotonic()
        hook.detach()  # the all_reduce is not done yet: its record must not be lost
        stop_s = time.monotonic() - start
        work.wait()
    dist.barrier()
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"stop_s": stop_s, "sum": t.tolist()}))
