"""Ranks that train until told to stop, timing every step and watching their own telemetry's
footprint, for the partition tests (collector.testing.partition); run under the hook, one process
per rank (gloo over ``eth0``):

    RANK=r WORLD_SIZE=n MASTER_ADDR=.. MASTER_PORT=.. python -m collector.hook partition_train.py OUT \\
        --stop FILE [--step-ms 50] [--rows 200] [--max-spool-bytes N]

Each step: ``--step-ms`` asleep (the device's kernels), a gradient all-reduce over the world, and
``--rows`` extra ``timers`` rows (the telemetry load a busy rank makes). Loops until FILE exists.
``--max-spool-bytes``: the client's spool limit (``telemetry.max_spool_bytes``, set on the running
client: ``python -m collector.hook`` takes no config).

Writes ``OUT/rank-<r>.json``: each step's seconds (``step_s``); every 0.5 s a sample (``samples``:
``time.time()``, step, the process's resident memory, the telemetry client's un-acked bytes
in memory, the envelopes waiting in its open stream's queue, and the bytes of this rank's spool
files); the rows it made (``rows``) and the rows its client counted as dropped (``dropped``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from collector.rank import hook, session
from collector.rank.clock import CLOCK

SAMPLE_S = 0.5


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _spool_bytes(spool_dir: Path, client_id: str) -> int:
    total = 0
    for entry in os.scandir(spool_dir) if spool_dir.is_dir() else ():
        if entry.name.startswith(client_id):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:  # acked and deleted meanwhile
                pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--stop", type=Path, required=True)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--max-spool-bytes", type=int)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    active = session.active()
    client = active.client
    if args.max_spool_bytes:
        client.cfg.max_spool_bytes = args.max_spool_bytes
    grad = torch.ones(4096)
    step_s, samples, rows = [], [], 0
    next_sample = time.monotonic()
    step = 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"started-{rank}").write_text("")
    while not args.stop.exists():
        hook.step(step)
        t0 = time.perf_counter()
        time.sleep(args.step_ms / 1e3)
        dist.all_reduce(grad)
        now_ns = CLOCK.now_ns()
        for i in range(args.rows):
            session.emit("timers", step=step, name=f"t{i}", start_ns=now_ns + i, dur_ns=1000)
        rows += args.rows
        step_s.append(time.perf_counter() - t0)
        now = time.monotonic()
        if now >= next_sample:
            stream = client._stream
            samples.append(
                {
                    "t": time.time(),
                    "step": step,
                    "rss": _rss_bytes(),
                    "unacked": client._unacked_bytes,
                    "queued": stream.outbox.qsize() if stream is not None else 0,
                    "spool": _spool_bytes(client.cfg.spool_dir, client.client_id),
                }
            )
            next_sample = now + SAMPLE_S
        step += 1
    dist.barrier()
    report = {"rank": rank, "steps": step, "rows": rows, "step_s": step_s, "samples": samples}
    dist.destroy_process_group()
    report["dropped"] = client.dropped_unspooled + client.dropped_rejected + client.buffer.dropped
    report["spool_dropped"] = client.spool_dropped
    (args.out / f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
