"""Streams one collector holds: RSS, threads, CPU per record and ack latency at 64 / 1,024 /
4,096 rank streams, against the sync collector it replaced; then the acceptance run.

    python -m benches.collector_streams [--sizes 64,1024,4096] [--hold 20] [--accept 120]
                                        [--baseline COMMIT]

Each simulated rank is one Stream that sends its Hello, then a batch of ``--rows`` comm
records every ``--period`` seconds for ``--hold`` seconds, then half-closes. Like the real
client, a rank whose stream breaks or is refused reopens it with backoff and resends what
is un-acked; the errors column counts those reopenings by the status they met.
The ranks are coroutines of grpc.aio clients in ``--generators`` processes of
their own (512 streams per HTTP/2 connection), so one process stands in for many hosts.
The collector runs as ``rankscope collect`` in its own process; its RSS and thread count
are sampled every second while every stream is open (the max is reported), its CPU time
over the hold gives records per collector CPU-second. Ack latency (sent -> acked) is the
freshness a dashboard sees: the collector acks a batch only once its Parquet segment and
ledger record are committed, and the catalog reads committed segments. Every run ends
with a count check: rows stored (read from the segments' footers) = rows acked.

The baseline is the sync grpc.server collector (a ThreadPoolExecutor, ``maximum_concurrent
_rpcs`` = 256) from ``--baseline`` (a commit of this repository, exported with ``git
archive``), at the same sizes in the same run; it refuses streams past 256, which the table
shows as errors. The acceptance run is 4,096 streams for ``--accept`` seconds on this tree.

Writes (replaces) its section of benches/RESULTS-scale.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing as mp
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from benches._common import BASELINE_COLLECTOR_COMMIT, baseline_tree, code_version, cpu_seconds
from benches._sections import replace_section
from collector.testing.collectors import stored_rows
from collector.tools.launch import CollectorProcess, wait_for_collector

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "RESULTS-scale.md"
STREAMS_PER_CONNECTION = 512
GIVE_UP_S = 60.0  # a rank still refused this long after its hold stops retrying (the sync baseline)


# ---- the simulated ranks (a generator process) ----


def generate(endpoint: str, first_rank: int, ranks: int, args: dict, ready, go, results) -> None:
    """``ranks`` rank streams from this process; puts a summary dict on ``results``."""
    asyncio.run(_generate(endpoint, first_rank, ranks, args, ready, go, results))


async def _generate(endpoint, first_rank, ranks, args, ready, go, results) -> None:
    import grpc

    from collector.data.codec import encode_batch
    from collector.testing.fake_runs import FakeRun, hello
    from proto import SCHEMA_VERSION, pb, pb_grpc

    rows = args["rows"]
    template = encode_batch("comm", "streams", 0, FakeRun(run_id="streams", world_size=16).comm_columns(0, 0, rows))
    channels = [
        grpc.aio.insecure_channel(endpoint, options=[("grpc.channel_id", first_rank + i)])  # one connection each
        for i in range(0, ranks, STREAMS_PER_CONNECTION)
    ]
    stubs = [pb_grpc.CollectorStub(c) for c in channels]
    summary = {"sent_rows": 0, "acked_rows": 0, "acked": 0, "errors": collections.Counter(), "latency_s": []}
    opened = asyncio.Event()
    open_count = [0]

    def count_open(counted: list) -> None:  # once per rank, when its first stream is open
        if not counted:
            counted.append(True)
            open_count[0] += 1
            if open_count[0] == ranks:
                opened.set()

    async def rank_stream(i: int) -> None:
        """One rank as the real client behaves: a broken stream is reopened with backoff and
        everything un-acked (the Hello first) is resent on the new one."""
        rank = first_rank + i
        client = f"streams-{rank}"
        pending: dict[int, tuple] = {1: (hello(client, 1, "streams", rank, args["world"]), time.monotonic(), 0)}
        counted: list[bool] = []
        seq, end, next_send, backoff = 1, None, None, 0.1

        async def read_acks(call):
            async for ack in call:
                now = time.monotonic()
                for acked in ack.seqs:
                    held = pending.pop(acked, None)
                    if held is not None and held[2]:
                        summary["acked_rows"] += held[2]
                        if random.random() < 0.05:
                            summary["latency_s"].append(now - held[1])
                    summary["acked"] += 1

        while True:
            call = stubs[i // STREAMS_PER_CONNECTION].Stream()
            reader = asyncio.create_task(read_acks(call))
            try:
                for resend in sorted(pending):
                    await call.write(pending[resend][0])
                count_open(counted)
                await go_event.wait()
                if end is None:
                    end = time.monotonic() + args["hold"]
                    next_send = time.monotonic() + random.uniform(0, args["period"])  # ranks out of phase
                while next_send < end:
                    await asyncio.sleep(max(0.0, next_send - time.monotonic()))
                    seq += 1
                    batch = pb.TableBatch()
                    batch.CopyFrom(template)
                    batch.rank = rank
                    env = pb.Envelope(schema_version=SCHEMA_VERSION, client_id=client, seq=seq, table=batch)
                    pending[seq] = (env, time.monotonic(), rows)
                    summary["sent_rows"] += rows
                    next_send += args["period"]
                    await call.write(env)
                await call.done_writing()
                await reader
                if not pending:
                    return
            except Exception as exc:  # a refused or broken stream: counted by what it said, then reopened
                if isinstance(exc, grpc.aio.AioRpcError):
                    summary["errors"][f"{exc.code().name}: {exc.details()}"] += 1
                else:
                    summary["errors"][f"{type(exc).__name__}: {exc}"] += 1
                reader.cancel()
                if reader.done() and not reader.cancelled():
                    reader.exception()  # already counted above
                count_open(counted)
                if end is not None and time.monotonic() > end + GIVE_UP_S:
                    summary["errors"][f"rank gave up {GIVE_UP_S:g} s after the hold, un-acked rows not counted"] += 1
                    return
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, 5.0)

    go_event = asyncio.Event()
    tasks = [asyncio.create_task(rank_stream(i)) for i in range(ranks)]
    await opened.wait()
    ready.put(first_rank)
    await asyncio.get_running_loop().run_in_executor(None, go.wait)
    go_event.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    lat = summary.pop("latency_s")
    summary["errors"] = dict(summary["errors"])
    summary["latency_s"] = lat
    results.put(summary)


# ---- one measurement ----


def proc_status(pid: int) -> tuple[int, int]:
    """(RSS bytes, threads) of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["Threads"])


def measure(streams: int, args: argparse.Namespace, tree: Path | None, label: str) -> dict:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="rs-streams-") as tmp, CollectorProcess(Path(tmp) / "data", tree=tree) as c:
        wait_for_collector(c.address)
        rss0, threads0 = proc_status(c.proc.pid)
        ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        per = -(-streams // args.generators)
        settings = {"rows": args.rows, "period": args.period, "hold": args.hold, "world": streams}
        gens = []
        for first in range(0, streams, per):
            n = min(per, streams - first)
            gens.append(ctx.Process(target=generate, args=(c.address, first, n, settings, ready, go, results)))
            gens[-1].start()
        for _ in gens:
            ready.get(timeout=600)
        time.sleep(1.0)
        held = _open_streams(c.address)
        cpu0, began = cpu_seconds(c.proc.pid), time.monotonic()
        go.set()
        peak_rss, peak_threads = proc_status(c.proc.pid)
        while time.monotonic() - began < args.hold:
            rss, threads = proc_status(c.proc.pid)
            peak_rss, peak_threads = max(peak_rss, rss), max(peak_threads, threads)
            time.sleep(1.0)
        summaries = [results.get(timeout=args.hold + GIVE_UP_S + 600) for _ in gens]
        cpu = cpu_seconds(c.proc.pid) - cpu0
        took = time.monotonic() - began
        for g in gens:
            g.join(30)
        c.stop(timeout_s=600)
        stored = stored_rows(Path(tmp) / "data")
    errors: collections.Counter = collections.Counter()
    for s in summaries:
        errors.update(s["errors"])
    latency = sorted(x for s in summaries for x in s["latency_s"])
    acked_rows = sum(s["acked_rows"] for s in summaries)
    return {
        "label": label,
        "streams": streams,
        "held": held,
        "rss0": rss0,
        "threads0": threads0,
        "rss": peak_rss,
        "threads": peak_threads,
        "sent_rows": sum(s["sent_rows"] for s in summaries),
        "acked_rows": acked_rows,
        "stored": stored,
        "cpu_s": cpu,
        "took_s": took,
        "errors": dict(errors),
        "p50_ms": 1e3 * latency[len(latency) // 2] if latency else float("nan"),
        "p99_ms": 1e3 * latency[int(len(latency) * 0.99)] if latency else float("nan"),
    }


def _open_streams(endpoint: str) -> int | None:
    """Streams the collector says it holds; None when its Health does not answer (the sync
    collector refuses every call once its concurrency is taken)."""
    try:
        return wait_for_collector(endpoint, timeout_s=5).open_streams
    except TimeoutError:
        return None


# ---- report ----


def held_text(m: dict) -> str:
    return "no Health answer in 5 s" if m["held"] is None else f"{m['held']:,}"


def row(m: dict) -> str:
    mib = 1 << 20
    errors = "; ".join(f"{n} x {e[:60]}" for e, n in m["errors"].items()) or "none"
    per_core = m["acked_rows"] / m["cpu_s"] if m["cpu_s"] else 0
    held = held_text(m)
    loss = "ok" if m["stored"] == m["acked_rows"] else f"stored {m['stored']:,} != acked {m['acked_rows']:,}"
    return (
        f"| {m['label']} | {m['streams']:,} | {held} | {m['rss0'] / mib:.0f} -> {m['rss'] / mib:.0f} "
        f"| {m['threads0']} -> {m['threads']} | {m['acked_rows']:,} | {m['acked_rows'] / m['took_s']:,.0f} "
        f"| {per_core:,.0f} | {m['p50_ms']:.0f} / {m['p99_ms']:.0f} | {loss} | {errors} |"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64,1024,4096")
    p.add_argument("--hold", type=float, default=30.0, help="seconds every stream sends, per size")
    p.add_argument("--accept", type=float, default=120.0, help="seconds of the 4,096-stream acceptance run (0: skip)")
    p.add_argument("--rows", type=int, default=100, help="comm records per batch")
    p.add_argument("--period", type=float, default=10.0, help="seconds between a rank's batches")
    p.add_argument("--generators", type=int, default=2, help="client processes")
    p.add_argument("--baseline", default=BASELINE_COLLECTOR_COMMIT, help="commit of the sync collector ('' to skip)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rs-baseline-") as tmp:
        tree = baseline_tree(ROOT, args.baseline, Path(tmp) / "tree") if args.baseline else None
        for n in sizes:
            for label, where in (("grpc.aio (this tree)", None), (f"sync baseline ({args.baseline})", tree)):
                if label.startswith("sync") and tree is None:
                    continue
                m = measure(n, args, where, label)
                rows.append(m)
                print(row(m), flush=True)
    accept = None
    if args.accept:
        hold = args.hold
        args.hold = args.accept
        accept = measure(4096, args, None, "acceptance: grpc.aio, 4,096 streams")
        args.hold = hold
        print(row(accept), flush=True)
    load1 = os.getloadavg()[0]
    header = (
        "| collector | streams | held (Health) | RSS MiB idle -> peak | threads idle -> peak | records acked "
        "| records/s | records per collector CPU-s | ack latency p50 / p99 ms | count check | errors |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    )
    text = [
        "# Collector streams: grpc.aio vs the sync server",
        "",
        f"Command: `python -m benches.collector_streams --sizes {args.sizes} --hold {args.hold:g} "
        f"--accept {args.accept:g} --rows {args.rows} --period {args.period:g} --generators {args.generators}` "
        f"&nbsp; Machine: {platform.machine()} VM, {os.cpu_count()} CPU cores, Linux {platform.release()}, "
        f"shared with other jobs (1-minute load average {load0:.1f} at the start, {load1:.1f} at the end); "
        f"{code_version(ROOT)}.",
        "",
        f"Each rank stream sends a Hello, then {args.rows} comm records every {args.period:g} s for "
        f"{args.hold:g} s; generators run in {args.generators} processes of their own on the same cores. RSS and "
        "threads are the collector process's (idle: before any stream; peak: sampled every second while all are "
        "open). Ack latency = sent -> acked, i.e. until the records are in a committed segment a query reads "
        "(end-to-end freshness; the store's flush interval is 0.25 s). Count check: rows in the stored segments "
        "= rows acked. Baseline: the same commands against the sync collector of the commit named.",
        "",
        header,
        *(row(m) for m in rows),
    ]
    if accept is not None:
        ok = not accept["errors"] and accept["stored"] == accept["acked_rows"] and (accept["held"] or 0) >= 4096
        text += [
            "",
            f"**Acceptance** (4,096 rank streams for {args.accept:g} s into one collector): "
            f"{'met' if ok else 'NOT met'}: {held_text(accept)} streams held, {accept['acked_rows']:,} records acked "
            f"and {accept['stored']:,} stored, errors: {accept['errors'] or 'none'}; collector RSS peak "
            f"{accept['rss'] / (1 << 20):.0f} MiB, {accept['threads']} threads.",
            "",
            row(accept).replace("| acceptance: ", "| "),
        ]
    replace_section(RESULTS, "\n".join(text))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
