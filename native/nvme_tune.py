"""Find the fastest AsyncIOHandle settings for a directory (DeepSpeed's ds_nvme_tune).

    python -m native.nvme_tune --dir /local_nvme [--io-size BYTES] [--loops N]

Sweeps block_size x queue_depth x single_submit x overlap_events x
intra_op_parallelism over a small default grid, timing a write then a read of
one io-size file per setting with a page-aligned buffer (so O_DIRECT applies
where the filesystem supports it), and prints the best read/write GB/s and the
`"aio": {...}` block to paste into the DeepSpeed config. The recommended
setting is the one with the best read and write throughput together (sum of
GB/s). On filesystems without O_DIRECT (tmpfs) the figures are page-cache speed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from native.aio import AsyncIOHandle

DEFAULT_GRID = {
    "block_size": [256 * 1024, 1024 * 1024, 4 * 1024 * 1024],
    "queue_depth": [8, 32],
    "single_submit": [False, True],
    "overlap_events": [False, True],
    "intra_op_parallelism": [1, 2],
}


@dataclass(frozen=True)
class Trial:
    settings: dict
    read_gbs: float
    write_gbs: float


def measure(directory: str, settings: dict, io_size: int, loops: int) -> Trial:
    """Best-of-`loops` write and read GB/s of one io_size file for one configuration."""
    handle = AsyncIOHandle(**settings)
    buffer = handle.new_cpu_locked_tensor(io_size, torch.empty(0, dtype=torch.uint8))
    buffer.fill_(0x5A)
    fd, path = tempfile.mkstemp(prefix="rankscope-nvme-tune-", suffix=".bin", dir=directory)
    os.close(fd)
    try:
        write_s = read_s = float("inf")
        for _ in range(loops):
            start = time.perf_counter()
            handle.sync_pwrite(buffer, path)
            write_s = min(write_s, time.perf_counter() - start)
            start = time.perf_counter()
            handle.sync_pread(buffer, path)
            read_s = min(read_s, time.perf_counter() - start)
        return Trial(settings, read_gbs=io_size / read_s / 1e9, write_gbs=io_size / write_s / 1e9)
    finally:
        handle.free_cpu_locked_tensor(buffer)
        os.unlink(path)


def sweep(directory: str, io_size: int, loops: int, grid: dict = DEFAULT_GRID, progress: bool = True) -> list[Trial]:
    names = list(grid)
    combos = [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]
    return [
        measure(directory, settings, io_size, loops)
        for settings in tqdm(combos, desc="nvme-tune", unit="config", disable=not progress)
    ]


def aio_config(trial: Trial) -> dict:
    """The DeepSpeed config block for a trial (booleans as DeepSpeed's tool prints them)."""
    s = trial.settings
    return {
        "aio": {
            "single_submit": str(s["single_submit"]).lower(),
            "overlap_events": str(s["overlap_events"]).lower(),
            "intra_op_parallelism": s["intra_op_parallelism"],
            "queue_depth": s["queue_depth"],
            "block_size": s["block_size"],
        }
    }


def _check_directory(directory: str) -> str | None:
    if not os.path.exists(directory):
        return f"--dir {directory}: no such directory"
    if not os.path.isdir(directory):
        return f"--dir {directory}: not a directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"--dir {directory}: not writable"
    return None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rankscope nvme-tune",
        description="Sweep AsyncIOHandle settings on a directory and print the best DeepSpeed 'aio' config.",
    )
    parser.add_argument("--dir", required=True, help="directory to test, on the device to tune (files are removed)")
    parser.add_argument(
        "--io-size",
        type=_positive_int,
        default=64 * 1024 * 1024,
        help="bytes written and read per measurement (default 64 MiB)",
    )
    parser.add_argument(
        "--loops", type=_positive_int, default=2, help="repetitions per setting, best one counts (default 2)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)

    problem = _check_directory(args.dir)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        trials = sweep(args.dir, args.io_size, args.loops, progress=not args.no_progress)
    except OSError as exc:
        print(f"error: I/O on {args.dir} failed: {exc}", file=sys.stderr)
        return 1
    best = max(trials, key=lambda t: t.read_gbs + t.write_gbs)
    print(
        f"Running DeepNVMe performance tuning on {os.path.abspath(args.dir)} "
        f"({len(trials)} settings, io size {args.io_size} bytes, {args.loops} loops)"
    )
    print(f"Best performance (GB/sec): read = {best.read_gbs:.2f}, write = {best.write_gbs:.2f}")
    print(json.dumps(aio_config(best), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
