"""A training step with a two-level (host, then across hosts) gradient all-reduce, as hybrid
sharded / hierarchical data parallelism does it, for runs over several hosts
(collector/testing/netns.py); run under the hook, one process per rank:

    RANK=r WORLD_SIZE=n MASTER_ADDR=.. MASTER_PORT=.. python -m collector.hook hosts_train.py OUT \\
        --ranks-per-host R [--steps S] [--grad-kib K] [--control DIR --pause-at K,...] [--fault sleep:RANK:MS@FROM]

Ranks ``h*R .. h*R+R-1`` are host h. Each step: ``--device-ms`` asleep (the device's kernels),
a small MLP's forward and backward, then its gradient (padded to ``--grad-kib`` KiB) all-reduced
inside the host (group ``host<h>``), the result all-reduced across hosts among the ranks with the
same local index (group ``cross<l>``); with 3 or more hosts also across each pair of neighbouring
hosts (h, h+1 mod H; as pipeline stages exchange), so a slow host's link slows some cross-host
groups and not others; then AdamW, and the loss all-reduced over the world for the log. The
groups inside a host never touch a link and the cross-host ones always do.

``--control DIR --pause-at K,...``: before step K, rank 0 writes ``DIR/request-K`` and every rank
waits for ``DIR/ack-K`` (collector.testing.netns.StepControl acts, e.g. throttles a link, then
acks), so a change of the network lands on a known step, not at a time. ``--fault sleep:RANK:MS@FROM``
busy-waits MS ms on RANK before each step from FROM (a compute straggler, to tell apart from a link).

Writes ``OUT/times.json`` (rank 0: each step's seconds, from its start to its logging all_reduce's
end; a pause comes before its step's start).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from collector.rank import hook
from collector.testing.workloads import busy_wait

WIDTH, BATCH = 128, 32
ACK_TIMEOUT_S = 600.0


def wait_for_ack(control: Path, step: int, rank: int) -> None:
    if rank == 0:
        (control / f"request-{step}").write_text(str(time.time()))
    deadline = time.monotonic() + ACK_TIMEOUT_S
    while not (control / f"ack-{step}").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"hosts_train: no {control}/ack-{step} within {ACK_TIMEOUT_S:.0f} s")
        time.sleep(0.002)


def shared_arguments(p: argparse.ArgumentParser) -> None:
    """The options every namespace-host workload takes (this one and world_train)."""
    p.add_argument("out", type=Path)
    p.add_argument("--ranks-per-host", type=int, required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--device-ms", type=float, default=30.0)
    p.add_argument("--control", type=Path)
    p.add_argument("--pause-at", default="")
    p.add_argument("--fault", default="", help="sleep:RANK:MS@FROM, a compute straggler")


class Steps:
    """What every step of a namespace-host workload does around its own collectives: wait at a
    ``--pause-at`` step for the test's ack (it throttles a link meanwhile), the ``--fault``'s busy wait,
    ``--device-ms`` asleep; then the logging all_reduce of the loss and the step's time. ``close``
    writes rank 0's ``OUT/times.json``."""

    def __init__(self, args: argparse.Namespace, prog: str) -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        self.args, self.times = args, []
        self.pause_at = {int(k) for k in args.pause_at.split(",") if k}
        self.fault = None
        if args.fault:
            kind, rank, ms_at = args.fault.split(":")
            ms, _, first = ms_at.partition("@")
            if kind != "sleep":
                raise SystemExit(f"{prog}: --fault {args.fault!r}: only sleep:RANK:MS@FROM")
            self.fault = (int(rank), float(ms) / 1e3, int(first or 0))

    def begin(self, step: int, rank: int) -> None:
        if step in self.pause_at and self.args.control is not None:
            wait_for_ack(self.args.control, step, rank)
        self._began = time.perf_counter()
        if self.fault and rank == self.fault[0] and step >= self.fault[2]:
            busy_wait(self.fault[1])
        time.sleep(self.args.device_ms / 1e3)

    def end(self, loss: torch.Tensor, world: int) -> None:
        total = loss.detach().clone()
        dist.all_reduce(total)
        self.times.append(time.perf_counter() - self._began)
        hook.log({"loss": float(total) / world})

    def close(self, rank: int) -> None:
        if rank == 0:
            (self.args.out / "times.json").write_text(json.dumps(self.times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shared_arguments(p)
    p.add_argument("--grad-kib", type=int, default=512)
    args = p.parse_args()
    steps = Steps(args, "hosts_train")

    dist.init_process_group("gloo")
    rank, world, per_host = dist.get_rank(), dist.get_world_size(), args.ranks_per_host
    if world % per_host:
        raise SystemExit(f"hosts_train: world size {world} is not a multiple of --ranks-per-host {per_host}")
    hosts = world // per_host
    # every rank creates every group, in the same order (torch.distributed's rule)
    intra = [dist.new_group([h * per_host + i for i in range(per_host)]) for h in range(hosts)]
    cross = [dist.new_group([h * per_host + i for h in range(hosts)]) for i in range(per_host)]
    pairs = (
        [[h * per_host + i, (h + 1) % hosts * per_host + i] for h in range(hosts) for i in range(per_host)]
        if hosts >= 3
        else []
    )
    pair_groups = [dist.new_group(sorted(members)) for members in pairs]
    # in one global order (the pair's index), so no two ranks wait for each other in a cycle
    mine_pairs = [g for members, g in zip(pairs, pair_groups, strict=True) if rank in members]
    mine_intra, mine_cross = intra[rank // per_host], cross[rank % per_host]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    n_params = sum(q.numel() for q in model.parameters())
    grad = torch.zeros(max(n_params, args.grad_kib * 256))  # float32: 256 a KiB
    for step in range(args.steps):
        steps.begin(step, rank)
        x = torch.randn(BATCH, WIDTH, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        grad[:n_params] = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
        dist.all_reduce(grad, group=mine_intra)
        dist.all_reduce(grad, group=mine_cross)
        for group in mine_pairs:
            exchanged = grad.clone()
            dist.all_reduce(exchanged, group=group)
        grad /= world
        offset = 0
        for q in model.parameters():
            q.grad.copy_(grad[offset : offset + q.numel()].view_as(q))
            offset += q.numel()
        opt.step()
        opt.zero_grad()
        steps.end(loss, world)
    steps.close(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
