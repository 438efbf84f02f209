"""Async I/O throughput: native.AsyncIOHandle vs `dd` with O_DIRECT, same directory.

    python -m benches.aio [--dir D] [--size BYTES] [--repeats N]

Target (issue 19): reads >= 0.9x and writes >= 1.0x of `dd iflag=direct` / `oflag=direct`
(bs=1M) on the same file system. Method: one --size file (default 1 GiB) per method, written
then read, every method once per round, the order reversed every other round, best round kept
(and the spread shown):
  dd:        dd if=/dev/zero of=F bs=1M count=N oflag=direct conv=notrunc
             dd if=F of=/dev/null bs=1M iflag=direct           (dd's own timing)
  rankscope: sync_pwrite / sync_pread of a page-aligned, page-locked 1 GiB buffer
             (new_cpu_locked_tensor), which the handle moves with O_DIRECT.
Three more rows explain the reads: dd with bs=128M (the handle's request size); the handle
reading into an ordinary page-aligned buffer (a torch tensor: 4 KiB pages, not from
new_cpu_locked_tensor); and the handle reading the file 1 MiB at a time into one reused 1 MiB
buffer (dd's pattern). The 0.77-0.89x of dd the issue reported were reads into 4 KiB pages
(new_cpu_locked_tensor was posix_memalign + mlock then); it now maps buffers of 2 MiB and more on a
2 MiB boundary with transparent huge pages (native/csrc/aio.cpp), which the default rows use.
Prints the table and writes its section of benches/RESULTS-native.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from benches._common import code_version
from benches._sections import replace_section
from native import AsyncIOHandle, aio

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "RESULTS-native.md"
SETTINGS = {
    "defaults (1 MiB blocks, qd 128, 1 thread)": {},
    "1 MiB blocks, qd 8, 2 threads, overlap_events": dict(queue_depth=8, intra_op_parallelism=2, overlap_events=True),
}
BASELINE = "dd (O_DIRECT, bs=1M)"
MiB = 1 << 20


def dd_seconds(args: list[str]) -> float:
    """Run dd and return the transfer time it reports."""
    result = subprocess.run(["dd", *args], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"dd {' '.join(args)} failed: {result.stderr.strip()}")
    match = re.search(r"copied, ([0-9.]+) s", result.stderr)
    if not match:
        raise RuntimeError(f"cannot parse dd output: {result.stderr.strip()}")
    return float(match.group(1))


def handle_seconds(handle: AsyncIOHandle, buffer: torch.Tensor, path: str, read: bool) -> float:
    start = time.perf_counter()
    (handle.sync_pread if read else handle.sync_pwrite)(buffer, path)
    return time.perf_counter() - start


def handle_chunked_read_seconds(handle: AsyncIOHandle, chunk: torch.Tensor, path: str, size: int) -> float:
    """dd's pattern through the handle: the file 1 MiB at a time into one reused buffer."""
    start = time.perf_counter()
    for offset in range(0, size, chunk.numel()):
        handle.sync_pread(chunk, path, file_offset=offset)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.aio", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="directory to test (default: the temp dir)")
    parser.add_argument("--size", type=int, default=1 << 30, help="bytes per file, a multiple of 128 MiB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.size % (128 * MiB):
        parser.error("--size must be a multiple of 128 MiB (dd uses bs=1M and bs=128M)")
    directory = tempfile.mkdtemp(prefix="rankscope-bench-aio-", dir=args.dir)
    files = {name: os.path.join(directory, f"{name}.bin") for name in ("dd", "dd128", "ours", "plain", "chunked")}
    mib = args.size >> 20
    handles = {label: AsyncIOHandle(**kw) for label, kw in SETTINGS.items()}
    first = next(iter(handles.values()))
    buffer = first.new_cpu_locked_tensor(args.size, torch.empty(0, dtype=torch.uint8))
    buffer.fill_(0x5A)
    chunk = first.new_cpu_locked_tensor(MiB, buffer)
    runs: dict[tuple[str, str], list[float]] = {}

    def dd(bs: str, count: int, path: str):
        return (
            lambda: dd_seconds(
                ["if=/dev/zero", f"of={path}", f"bs={bs}", f"count={count}", "oflag=direct", "conv=notrunc"]
            ),
            lambda: dd_seconds([f"if={path}", "of=/dev/null", f"bs={bs}", "iflag=direct"]),
        )

    methods = {BASELINE: dd("1M", mib, files["dd"]), "dd (O_DIRECT, bs=128M)": dd("128M", mib // 128, files["dd128"])}
    for label, handle in handles.items():
        methods[f"rankscope AsyncIOHandle ({aio.BACKEND}): {label}"] = (
            lambda h=handle: handle_seconds(h, buffer, files["ours"], read=False),
            lambda h=handle: handle_seconds(h, buffer, files["ours"], read=True),
        )
    storage = torch.empty(args.size + 4096, dtype=torch.uint8)
    plain = storage[(-storage.data_ptr()) % 4096 :][: args.size]  # page-aligned, ordinary 4 KiB pages
    plain.fill_(0x5A)
    methods[f"rankscope AsyncIOHandle ({aio.BACKEND}): defaults, into an ordinary page-aligned tensor"] = (
        lambda: handle_seconds(first, plain, files["plain"], read=False),
        lambda: handle_seconds(first, plain, files["plain"], read=True),
    )
    methods[f"rankscope AsyncIOHandle ({aio.BACKEND}): defaults, read 1 MiB at a time into one reused buffer"] = (
        lambda: handle_seconds(first, buffer, files["chunked"], read=False),
        lambda: handle_chunked_read_seconds(first, chunk, files["chunked"], args.size),
    )

    load_before = os.getloadavg()[0]
    try:
        for round_ in range(args.repeats):
            for label in list(methods) if round_ % 2 == 0 else list(methods)[::-1]:
                write, read = methods[label]
                runs.setdefault((label, "write"), []).append(write())
                runs.setdefault((label, "read"), []).append(read())
    finally:
        for path in files.values():
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(directory)

    gbs = {key: args.size / min(seconds) / 1e9 for key, seconds in runs.items()}
    spread = {key: [args.size / s / 1e9 for s in seconds] for key, seconds in runs.items()}
    table = [
        "| method | write GB/s | read GB/s | write vs dd | read vs dd | reads, every round (GB/s) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label in methods:
        table.append(
            f"| {label} | {gbs[label, 'write']:.2f} | {gbs[label, 'read']:.2f} | "
            f"{100 * gbs[label, 'write'] / gbs[BASELINE, 'write']:.0f}% | "
            f"{100 * gbs[label, 'read'] / gbs[BASELINE, 'read']:.0f}% | "
            f"{', '.join(f'{x:.2f}' for x in spread[label, 'read'])} |"
        )
    ours = f"rankscope AsyncIOHandle ({aio.BACKEND}): {next(iter(SETTINGS))}"
    ratio = [o / d for o, d in zip(spread[ours, "read"], spread[BASELINE, "read"])]
    fs = subprocess.run(["df", "-T", args.dir], capture_output=True, text=True).stdout.splitlines()[-1].split()
    text = "\n".join(
        [
            "# Async I/O (native.AsyncIOHandle vs dd O_DIRECT)",
            "",
            f"- command: `python -m benches.aio --dir {args.dir} --size {args.size} --repeats {args.repeats}`",
            f"- machine: {os.cpu_count()}-core CPU VM ({platform.machine()}), directory on {fs[0]} ({fs[1]}); "
            f"load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after (other jobs shared the "
            f"machine and its disk); date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            f"- rankscope code: {code_version(ROOT)}",
            f"- {args.size} bytes per transfer, {args.repeats} rounds (every method once per round, order reversed "
            "every other round), best round in the GB/s columns; dd timing is dd's own",
            "",
            *table,
            "",
            f"Reads, defaults vs dd bs=1M, round by round: {', '.join(f'{100 * r:.0f}%' for r in ratio)} "
            f"(median {100 * statistics.median(ratio):.0f}%).",
            "",
            "Reading the rows: dd bs=1M has one synchronous 1 MiB request in flight and reuses one 1 MiB buffer;",
            "the handle issues 128 MiB requests (block_size x queue_depth) into the tensor's own buffer, which",
            "new_cpu_locked_tensor maps on a 2 MiB boundary with transparent huge pages. The row 'into an ordinary",
            "page-aligned tensor' is the same read into 4 KiB pages: the gap between the two is the destination",
            "buffer, not the I/O engine (likely: fewer, larger segments per request for the virtual disk, and fewer",
            "TLB misses in the copy). Buffer and offsets are page-aligned, so every byte goes through O_DIRECT.",
            "`python -m native.nvme_tune --dir D` sweeps the handle's settings for a given device.",
        ]
    )
    print(text)
    replace_section(RESULTS, text)
    print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
