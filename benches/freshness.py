"""Freshness: time from a record's creation to its being visible to a DuckDB query.

    python -m benches.freshness [--seconds 10] [--rate 20]

A sender creates one monitor record every 1/rate s (its creation time in
``time_ns``) and ships it at once on its own Stream; a reader polls the catalog
(``catalog.connect``, one connection, like the dashboard) for the newest visible
record. Latency = the wall time at which a query first returned the record minus
its creation time, for every record. Measured twice in one run: with the
collector otherwise idle, and while 4 more client processes stream comm batches
(~160k records/s). The rank-side client's own batching delay is not included
(the sender does not batch); add it from that client's configuration.

Writes (replaces) the freshness section of benches/RESULTS-ingest.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import queue
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from benches._sections import replace_section
from benches.ingest import comm_columns
from collector.tools.launch import CollectorProcess

HERE = Path(__file__).resolve().parent
LOAD_CLIENTS, LOAD_ROWS, LOAD_BATCHES_PER_S = 4, 4096, 10


def background_load(address: str, rank: int, stop) -> None:
    """One rank streaming comm batches at a steady rate until told to stop."""
    from collector.data.codec import encode_batch
    from proto import SCHEMA_VERSION, pb, pb_grpc

    template = encode_batch("comm", "load", rank, comm_columns(LOAD_ROWS, rank))
    seq_col = next(c for c in template.columns if c.name == "seq")

    def envelopes():
        seq = 0
        while not stop.is_set():
            seq += 1
            seq_col.i64 = (np.arange(LOAD_ROWS, dtype="<i8") + seq * LOAD_ROWS).tobytes()
            yield pb.Envelope(schema_version=SCHEMA_VERSION, client_id=f"load-{rank}", seq=seq, table=template)
            time.sleep(1 / LOAD_BATCHES_PER_S)

    channel = grpc.insecure_channel(address)
    for _ in pb_grpc.CollectorStub(channel).Stream(envelopes()):
        pass
    channel.close()


def measure(data: Path, address: str, seconds: float, rate: float, run_id: str) -> np.ndarray:
    from collector.data import catalog
    from collector.data.codec import encode_batch
    from proto import SCHEMA_VERSION, pb, pb_grpc

    n = int(seconds * rate)
    created = np.zeros(n, dtype=np.int64)
    outbox: queue.Queue = queue.Queue()

    def sender():
        for i in range(n):
            created[i] = time.time_ns()
            batch = encode_batch(
                "monitor",
                run_id,
                0,
                {"step": [i], "tag": ["fresh"], "value": [float(i)], "samples": [i], "time_ns": [created[i]]},
            )
            outbox.put(pb.Envelope(schema_version=SCHEMA_VERSION, client_id=f"fresh-{run_id}", seq=i + 1, table=batch))
            time.sleep(1 / rate)
        outbox.put(None)

    channel = grpc.insecure_channel(address)
    acks = pb_grpc.CollectorStub(channel).Stream(iter(outbox.get, None))
    threading.Thread(target=lambda: [None for _ in acks], daemon=True).start()
    threading.Thread(target=sender, daemon=True).start()

    visible = np.zeros(n, dtype=np.int64)
    seen = 0
    con = catalog.connect(data)
    deadline = time.monotonic() + seconds + 30
    while seen < n and time.monotonic() < deadline:
        catalog.pin(con, data)  # a connection reads the snapshot it was pinned to: take the newest
        newest = catalog.with_segment_retry(
            lambda: con.execute("SELECT max(step) FROM monitor WHERE run_id = ?", [run_id]).fetchone()[0]
        )
        now = time.time_ns()
        if newest is not None and newest + 1 > seen:
            visible[seen : newest + 1] = now  # one stream commits in order: all up to newest are visible
            seen = newest + 1
    channel.close()
    if seen < n:
        raise RuntimeError(f"only {seen} of {n} records became visible")
    return (visible - created) / 1e6  # ms


def summary(lat_ms: np.ndarray) -> dict:
    return {
        "n": len(lat_ms),
        "p50": float(np.percentile(lat_ms, 50)),
        "p95": float(np.percentile(lat_ms, 95)),
        "max": float(lat_ms.max()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=20.0, help="records created per second")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS-ingest.md")
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    results = {}
    with tempfile.TemporaryDirectory(prefix="rankscope-fresh-") as tmp:
        data = Path(tmp) / "data"
        with CollectorProcess(data) as collector:
            results["idle collector"] = summary(measure(data, collector.address, args.seconds, args.rate, "idle"))
            stop = ctx.Event()
            loaders = [
                ctx.Process(target=background_load, args=(collector.address, r, stop)) for r in range(LOAD_CLIENTS)
            ]
            for p in loaders:
                p.start()
            time.sleep(3)  # loaders importing and connecting
            load = os.getloadavg()[0]
            results[
                f"{LOAD_CLIENTS} streams adding ~{LOAD_CLIENTS * LOAD_ROWS * LOAD_BATCHES_PER_S // 1000}k rec/s"
            ] = summary(measure(data, collector.address, args.seconds, args.rate, "loaded"))
            stop.set()
            for p in loaders:
                p.join(30)

    ok = all(r["p95"] <= 1000 for r in results.values())
    rows = "\n".join(
        f"| {name} | {r['n']} | {r['p50']:.0f} | **{r['p95']:.0f}** | {r['max']:.0f} |" for name, r in results.items()
    )
    for name, r in results.items():
        print(f"{name}: p50 {r['p50']:.0f} ms, p95 {r['p95']:.0f} ms, max {r['max']:.0f} ms over {r['n']} records")
    machine = f"{platform.machine()} VM, {os.cpu_count()} CPU cores"
    section = f"""
# Freshness (record created -> visible to a DuckDB query)

Command: `python -m benches.freshness --seconds {args.seconds:g} --rate {args.rate:g}` &nbsp; Machine: {machine},
shared with other jobs (1-minute load average {load:.1f} during the loaded part).

| collector state | records | p50 ms | p95 ms | max ms |
|---|---:|---:|---:|---:|
{rows}

Target p95 <= 1000 ms: {"met" if ok else "**not met**"}. Baseline for comparison: the store's flush interval
(250 ms) is the floor a record waits for its commit; the rest is the Parquet write + fsync and the
reader's query (which lists and opens the segment files).
"""
    replace_section(args.out, section)
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
