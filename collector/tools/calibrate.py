"""``rankscope calibrate``: an nccl-tests-style sweep of what each collective costs on these hosts,
stored in the data dir (collector.data.calibration) for the slow-link finding to judge later runs by.

    torchrun --nnodes 2 --nproc-per-node 8 ... -m collector.tools.calibrate --data-dir /shared/rs
    rankscope calibrate --nproc 4 --data-dir D        # N local ranks, launched here

Every rank learns every rank's host (``socket.gethostname()``, as the hook reports it) and makes
the job's groups: the world, the ranks inside each host, and across hosts the ranks with the
same local index (as hierarchical data parallelism runs them). For each op (all_reduce,
all_gather_single, reduce_scatter_single, broadcast) and data size S (the comm table's:
all_gather the gathered output, reduce_scatter the full input), the groups of one kind run side
by side -- every host's group at once, every cross-host group at once, as training runs them --
``iters`` timed collectives after one warm-up; a group's time per collective is the median over
iterations of its slowest rank's time (all_reduce MAX over the group), a kind's the slowest
group's. Each result is checked against what the op must give (a sum, a concatenation, the
root's tensor) before it counts. Rank 0 writes one row per (op, S, span, group size) with its
busbw (nccl-tests' factors, collector.data.bandwidth) for the run's host set, and prints them.

Backend: NCCL on CUDA tensors where CUDA is present (synchronised around each timed op), else
gloo on CPU; only gloo is tested here (no GPU). A rank ends with a barrier and exits without
interpreter finalization (collector.testing.gloo.leave_world says why).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from collector.data.bandwidth import bus_factor

OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather_single",
    "reduce_scatter": "reduce_scatter_single",
    "broadcast": "broadcast",
}
DEFAULT_SIZES = "64K,256K,1M,4M,16M"
DEFAULT_ITERS = 20
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_sizes(text: str) -> list[int]:
    """'64K,1M' -> [65536, 1048576] (binary units, bytes)."""
    sizes = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", part, re.IGNORECASE)
        if not match or int(match.group(1)) <= 0:
            raise ValueError(f"size {part!r} is not a positive number of bytes with an optional K, M or G")
        sizes.append(int(match.group(1)) * UNITS[match.group(2).upper()])
    return sorted(set(sizes))


def parse_ops(text: str) -> list[str]:
    ops = [o.strip() for o in text.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown or not ops:
        raise ValueError(f"ops {unknown or text!r}: choose from {', '.join(OPS)}")
    return ops


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=Path("rankscope-data"), help="where rank 0 stores the result")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"data sizes S, comma-separated (default {DEFAULT_SIZES})")
    p.add_argument("--ops", default=",".join(OPS), help=f"collectives (default all: {','.join(OPS)})")
    p.add_argument(
        "--iters", type=int, default=DEFAULT_ITERS, help=f"timed collectives per size (default {DEFAULT_ITERS})"
    )


def groups_of(hosts: list[str]) -> list[tuple[str, str, list[int]]]:
    """(kind, span, ranks) of the groups to measure, given each rank's host: the world; each host's
    ranks (two or more); across hosts, the ranks with the same local index (two or more hosts).
    Every rank makes every group, in this order (torch.distributed.new_group's rule)."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    several = len(by_host) > 1
    out = [("world", "inter" if several else "intra", list(range(len(hosts))))]
    out += [("host", "intra", ranks) for _, ranks in sorted(by_host.items()) if len(ranks) > 1]
    if several:
        width = max(len(r) for r in by_host.values())
        for local in range(width):
            ranks = [rs[local] for _, rs in sorted(by_host.items()) if local < len(rs)]
            if len(ranks) > 1:
                out.append(("cross", "inter", ranks))
    return out


def _tensors(op: str, nbytes: int, n: int, index: int, device):
    """(input, output) for ``op`` on a group of ``n`` at data size about ``nbytes`` (float32, a
    multiple of n elements), filled with the rank's index + 1 so the result can be checked."""
    import torch

    numel = max(n, nbytes // 4 // n * n)
    value = float(index + 1)
    if op == "all_gather":
        return torch.full((numel // n,), value, device=device), torch.empty(numel, device=device)
    if op == "reduce_scatter":
        return torch.full((numel,), value, device=device), torch.empty(numel // n, device=device)
    return torch.full((numel,), value, device=device), None


def _run(op: str, tensors, group, root: int) -> None:
    import torch.distributed as dist

    src, dst = tensors
    if op == "all_reduce":
        dist.all_reduce(src, group=group)
    elif op == "all_gather":
        dist.all_gather_single(dst, src, group=group)
    elif op == "reduce_scatter":
        dist.reduce_scatter_single(dst, src, group=group)
    else:
        dist.broadcast(src, src=root, group=group)


def _check(op: str, tensors, n: int, index: int) -> None:
    """The result of one untimed collective on fresh tensors: what the op must give."""
    import torch

    src, dst = tensors
    total = n * (n + 1) / 2  # the indexes + 1 summed over the group
    if op == "all_reduce":
        want = torch.full_like(src, total)
        got = src
    elif op == "all_gather":
        want = torch.arange(1, n + 1, dtype=src.dtype, device=src.device).repeat_interleave(src.numel())
        got = dst
    elif op == "reduce_scatter":
        want, got = torch.full_like(dst, total), dst
    else:
        want, got = torch.full_like(src, 1.0), src  # the root is the group's first rank: index 0
    torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m: f"calibrate: {op} gave a wrong result: {m}")


def sweep(args: argparse.Namespace) -> None:
    """One rank's part (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment)."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts: list = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    groups = [(kind, span, ranks, dist.new_group(ranks)) for kind, span, ranks in groups_of(hosts)]
    found = []  # (op, bytes, kind, span, size, time_us) from each group's first rank
    for op in parse_ops(args.ops):
        for nbytes in parse_sizes(args.sizes):
            for kind in dict.fromkeys(k for k, *_ in groups):
                mine = [(span, ranks, g) for k, span, ranks, g in groups if k == kind and rank in ranks]
                dist.barrier()  # the groups of one kind start together
                for span, ranks, group in mine:
                    n, index = len(ranks), ranks.index(rank)
                    tensors = _tensors(op, nbytes, n, index, device)
                    _run(op, tensors, group, ranks[0])  # warm-up
                    times = torch.zeros(args.iters, dtype=torch.float64)
                    for i in range(args.iters):
                        if cuda:
                            torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        _run(op, tensors, group, ranks[0])
                        if cuda:
                            torch.cuda.synchronize()
                        times[i] = time.perf_counter() - t0
                    slowest = times.to(device)
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
                    fresh = _tensors(op, nbytes, n, index, device)
                    _run(op, fresh, group, ranks[0])
                    _check(op, fresh, n, index)
                    if index == 0:
                        size = fresh[1].numel() if op == "all_gather" else fresh[0].numel()
                        found.append((op, size * 4, kind, span, n, float(slowest.median()) * 1e6))
    gathered: list = [None] * world
    dist.all_gather_object(gathered, found)
    if rank == 0:
        _store(args.data_dir, hosts, [row for part in gathered for row in part])
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _store(data_dir: Path, hosts: list[str], found: list[tuple]) -> None:
    import pandas as pd

    from collector.data import calibration  # here: the CLI builds this command's parser on every call

    df = pd.DataFrame(found, columns=["op", "bytes", "kind", "span", "group_size", "time_us"])
    rows = (
        df.groupby(["op", "bytes", "span", "group_size"])
        .agg(groups=("time_us", "size"), time_us=("time_us", "max"))
        .reset_index()
    )
    factor = [bus_factor(OPS[op], int(n)) for op, n in zip(rows.op, rows.group_size, strict=True)]
    rows["busbw_gbs"] = rows.bytes * factor / (rows.time_us * 1e3)
    rows["measured_at"] = pd.Timestamp.now(tz="UTC")
    path = calibration.write(data_dir, hosts, rows)
    print(f"calibration of {len(set(hosts))} host(s), {len(hosts)} ranks -> {path}")
    print(f"{'op':<15}{'span':<7}{'ranks':>6}{'bytes':>12}{'time_us':>12}{'busbw GB/s':>12}")
    for r in rows.sort_values(["op", "span", "group_size", "bytes"]).itertuples():
        print(f"{r.op:<15}{r.span:<7}{r.group_size:>6}{r.bytes:>12}{r.time_us:>12.1f}{r.busbw_gbs:>12.3f}")


def launch(args: argparse.Namespace, nproc: int) -> int:
    """``nproc`` ranks of this sweep on this machine (what torchrun would start); their exit code."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "collector.tools.calibrate", "--data-dir", str(args.data_dir)]
    argv += ["--sizes", args.sizes, "--ops", args.ops, "--iters", str(args.iters)]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc))
    procs = [
        subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nproc)))
        for r in range(nproc)
    ]
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c != 0), 0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m collector.tools.calibrate", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise SystemExit(
                f"calibrate: ${name} is not set: launch with torchrun, or run `rankscope calibrate --nproc N`"
            )
    sweep(args)


if __name__ == "__main__":
    main()
