"""Timestamps for records: cheap on the training thread, comparable across hosts.

The hot path only reads ``time.perf_counter_ns()`` (monotonic, immune to NTP
steps). ``Clock.wall_ns`` turns such a reading into unix ns from one anchor pair
taken at start-up, minus this rank's offset to rank 0's clock, so timestamps
from every rank of a run share rank 0's time line.

Offsets: ranks on rank 0's host share its clock and get exactly 0. Across
hosts, ``estimate_offsets`` runs a few rounds of barrier + all_gather(time_ns)
and takes the per-rank median of (my time - rank 0's time); after a barrier
all ranks leave within roughly one network latency, which bounds the error.
"""

from __future__ import annotations

import socket
import statistics
import time

perf_ns = time.perf_counter_ns


class Clock:
    def __init__(self) -> None:
        self.anchor_wall_ns = time.time_ns()
        self.anchor_perf_ns = perf_ns()
        self.offset_ns = 0  # this rank's clock minus rank 0's

    def wall_ns(self, perf: int) -> int:
        """A perf_counter_ns reading -> unix ns on rank 0's clock."""
        return self.anchor_wall_ns + (perf - self.anchor_perf_ns) - self.offset_ns

    def now_ns(self) -> int:
        return self.wall_ns(perf_ns())

    def wall_drift_ns(self) -> int:
        """How far this host's system clock has moved from the monotonic one since the anchor: NTP's
        slewing keeps it within milliseconds; a jump is the clock stepped (NTP, a manual change)."""
        return time.time_ns() - (self.anchor_wall_ns + perf_ns() - self.anchor_perf_ns)


CLOCK = Clock()


def estimate_offsets(group=None, rounds: int = 5) -> int:
    """This rank's clock minus rank 0's, in ns. Collective: every rank of the
    (initialised) default group must call it. Uses the un-instrumented c10d
    functions so the exchange is not recorded as training traffic."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    world = c10d.get_world_size(group)
    if world == 1:
        return 0
    device = collective_device(group)
    hosts: list = [None] * world
    c10d.all_gather_object(hosts, socket.gethostname(), group=group)
    if all(h == hosts[0] for h in hosts):
        return 0  # one host, one clock (every rank sees the same list, so all skip the rounds)
    me = c10d.get_rank(group)
    samples = []
    for _ in range(rounds):
        c10d.barrier(group=group)
        mine = torch.tensor([time.time_ns()], dtype=torch.int64, device=device)
        out = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(world)]
        c10d.all_gather(out, mine, group=group)
        samples.append(int(out[me].item()) - int(out[0].item()))
    # the median over rounds is robust to one slow round
    return 0 if hosts[me] == hosts[0] else int(statistics.median(samples))


def collective_device(group=None):
    """The device a tensor must live on for the group's backend (NCCL: CUDA)."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    if c10d.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
