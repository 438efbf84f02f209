"""Rank processes for the torch.profiler import test: 2 gloo ranks train a small DDP model (AdamW,
several gradient buckets, the loss all-reduced for logging before each optimizer step) with the
hook attached AND torch.profiler on, its schedule recording the steps after DDP's bucket rebuild
(the second iteration's broadcasts, which DDP's C++ reducer issues where the hook does not see
them). Each rank's trace is written by torch's own ``tensorboard_trace_handler``: rank 0 plain,
rank 1 gzipped, both named ``<host>_<pid>.<time>.pt.trace.json[.gz]`` (no rank in the name)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from collector import hook
from collector.rank import session
from collector.testing.gloo import leave_world, torchrun_env

WORLD = 2
SKIPPED, WARMUP, ACTIVE = 2, 1, 4  # iterations 0-1 unprofiled (DDP rebuilds its buckets in iteration 1)
ITERATIONS = SKIPPED + WARMUP + ACTIVE
FIRST_STEP = SKIPPED + WARMUP + 1  # the hook's step of the first recorded iteration (ProfilerStep#3)
SLOW_S = 0.04
TP_DP_ACTIVE = 8


def _one_of_each(rank: int) -> None:
    """Every other collective gloo runs, each with a size of its own, so each maps to its row."""
    t = torch.ones(6)
    dist.broadcast(t, 0)
    dist.all_gather([torch.zeros(6) for _ in range(WORLD)], t)
    dist.all_gather_into_tensor(torch.zeros(10 * WORLD), torch.ones(10))
    dist.reduce_scatter(torch.zeros(3), [torch.ones(3) for _ in range(WORLD)])
    dist.reduce_scatter_tensor(torch.zeros(7), torch.ones(7 * WORLD))
    dist.all_to_all_single(torch.zeros(4 * WORLD, dtype=torch.float64), torch.ones(4 * WORLD, dtype=torch.float64))
    dist.gather(torch.ones(5), [torch.zeros(5) for _ in range(WORLD)] if rank == 0 else None, 0)
    dist.scatter(torch.zeros(9), [torch.ones(9) for _ in range(WORLD)] if rank == 0 else None, 0)
    dist.reduce(torch.ones(11, dtype=torch.int64), 0)
    dist.barrier()


def worker(rank: int, port: int, endpoint: str | None, out: str, slow_rank: int = -1, active: int = ACTIVE) -> None:
    """The profiled DDP run; with ``endpoint`` None no hook (a user's own traces), and ``slow_rank``
    >= 0 that rank holds the others back SLOW_S in each step's loss all_reduce."""
    torchrun_env(rank, WORLD, port)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if endpoint:
        hook.attach(run="profiled-ddp", endpoint=endpoint)
    dist.init_process_group("gloo")
    if endpoint:
        client = session.active().client
        deadline = time.monotonic() + 60
        while client.acked == 0 and time.monotonic() < deadline:  # the run exists before training
            time.sleep(0.05)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.03)  # a few buckets a step
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handler = tensorboard_trace_handler(out, use_gzip=rank == 1)
    plan = schedule(wait=SKIPPED, warmup=WARMUP, active=active, repeat=1)
    # rank 0 with Python stacks (its collectives timed from the script's call), rank 1 without
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        with_stack=rank == 0,
        schedule=plan,
        on_trace_ready=handler,
    ) as prof:
        for _ in range(SKIPPED + WARMUP + active):
            x = torch.randn(32, 64)
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            logged = loss.detach().clone()
            if rank == slow_rank:
                time.sleep(SLOW_S)
            dist.all_reduce(logged)  # the script's own logging collective
            _one_of_each(rank)
            opt.step()
            opt.zero_grad()
            prof.step()
    if endpoint:
        hook.detach()
    leave_world()


def two_groups(rank: int, port: int, out: str) -> None:
    """One rank, no hook: a trace taken before any process group exists (``plain.json``: no
    distributedInfo), then one with collectives on two process groups (``groups.json``)."""
    torchrun_env(rank, 1, port)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.ones(8).sum()
    prof.export_chrome_trace(f"{out}/plain.json")
    dist.init_process_group("gloo")
    pair = dist.new_group([0])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), group=pair)
    prof.export_chrome_trace(f"{out}/groups.json")
    leave_world()


def tp_dp(rank: int, port: int, endpoint: str | None, out: str) -> None:
    """4 ranks as a TP x DP job lays them out, profiled, no group named in any trace event: TP pairs
    [0,1], [2,3] and DP pairs [0,2], [1,3] beside the world, described as tp and dp (as Megatron
    does). Each step: two TP all_reduces and a TP all_gather_into_tensor (the same on every pair, in
    step), a DP all_reduce of the TP all_reduce's size, and the loss all_reduced over the world."""
    world = 4
    torchrun_env(rank, world, port)
    torch.set_num_threads(1)
    if endpoint:
        hook.attach(run="profiled-tp-dp", endpoint=endpoint)
    dist.init_process_group("gloo")
    tp = [dist.new_group([0, 1], group_desc="tp"), dist.new_group([2, 3], group_desc="tp")][rank // 2]
    dp = [dist.new_group([0, 2], group_desc="dp"), dist.new_group([1, 3], group_desc="dp")][rank % 2]
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)  # the hook's steps: one per optimizer step
    handler = tensorboard_trace_handler(out, worker_name=f"rank{rank}")
    plan = schedule(wait=SKIPPED, warmup=WARMUP, active=TP_DP_ACTIVE, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=plan, on_trace_ready=handler) as prof:
        for _ in range(SKIPPED + WARMUP + TP_DP_ACTIVE):
            time.sleep(0.02)  # the device's share of a step
            dist.all_reduce(torch.ones(64), group=tp)
            dist.all_gather_into_tensor(torch.zeros(32), torch.ones(16), group=tp)
            dist.all_reduce(torch.ones(64), group=tp)
            dist.all_reduce(torch.ones(64), group=dp)
            dist.all_reduce(torch.ones(1))
            param.grad = torch.zeros(1)
            opt.step()
            prof.step()
    if endpoint:
        hook.detach()
    leave_world()
