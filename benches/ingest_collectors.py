"""Sustained durable ingest with 1, 2 and 4 collectors sharing one data dir.

    python -m benches.ingest_collectors [--collectors 1 2 4] [--repeats 2] [--clients 8] [--batches 16] [--rows 16384]

Per configuration: n collectors, each ``rankscope collect --data-dir D --port P_i
--writer-id c<i>`` (its own process and port, one fresh D shared by all n, see
docs/SCALING.md), and ``--clients`` client processes as in benches/ingest.py (one
Stream each, pre-encoded comm TableBatches, window of 8 unacked envelopes), client
``rank`` connected to collector ``rank % n``. Timed from the moment every client is
connected to the last ack (acks come only once the segment and ledger record are
fsync'd); then every collector is stopped (SIGTERM) and the rows are counted in DuckDB
through the one catalog: total = distinct (rank, seq) = sent, and each rank's rows only
under its own collector's writer id. Collector CPU = user + system of the n collector
processes over the timed part (psutil).

Configurations run in the order 1, 2, 4, 4, 2, 1 (``--repeats`` 2), so a load change
from the other jobs on the machine hits all of them. Writes benches/RESULTS-collectors.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version
from collector.tools.launch import CollectorProcess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "RESULTS-collectors.md"
RANKSCOPE = Path(sys.executable).parent / "rankscope"


def run(n: int, clients: int, batches: int, rows: int) -> dict:
    from benches.ingest import drive_clients

    with tempfile.TemporaryDirectory(prefix="rankscope-bench-collectors-") as tmp:
        data = Path(tmp) / "data"
        colls = []
        try:
            colls = [CollectorProcess(data, "--writer-id", f"c{i}") for i in range(n)]
            burst = drive_clients(colls, clients, batches, rows)
        finally:
            for c in colls:
                c.stop()
        on_disk = sum(f.stat().st_size for f in (data / "parquet" / "comm").rglob("*.parquet"))
        commits = sum(1 for f in (data / "ledger").rglob("log-*.jsonl") for line in f.open() if line.strip())
        from collector.data import catalog

        con = catalog.connect(data)
        try:
            total, distinct = con.execute("SELECT count(*), count(DISTINCT (rank, seq)) FROM comm").fetchone()
            glob = str(data / "parquet" / "comm" / "*" / "*.parquet")
            per_writer = con.execute(
                "SELECT regexp_extract(filename, '(seg|cmp)-([a-z][a-z0-9_]*)-', 2) AS w, "
                "list(DISTINCT rank ORDER BY rank) AS ranks, count(*) FROM read_parquet(?, filename=true) "
                "GROUP BY w ORDER BY w",
                [glob],
            ).fetchall()
        finally:
            con.close()
    expected = clients * batches * rows
    routed_ok = (
        all(sorted(ranks) == [r for r in range(clients) if f"c{r % n}" == w] for w, ranks, _ in per_writer)
        and len(per_writer) == n
    )
    return {
        "n": n,
        "elapsed": burst["elapsed"],
        "expected": expected,
        "stored": total,
        "distinct": distinct,
        "rate": expected / burst["elapsed"],
        "cpu": burst["collector_cpu"],
        "clients_cpu": burst["clients_cpu"],
        "load": burst["load"],
        "per_writer": [(w, count) for w, _, count in per_writer],
        "routed_ok": routed_ok,
        "disk_bytes_per_record": on_disk / max(total, 1),
        "ledger_lines": commits,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benches.ingest_collectors", description=__doc__.splitlines()[0])
    ap.add_argument("--collectors", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=2, help="passes over --collectors, alternating direction")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--batches", type=int, default=16, help="envelopes per client")
    ap.add_argument("--rows", type=int, default=16384, help="comm records per envelope")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    from benches.ingest import baselines

    load0 = os.getloadavg()
    t_start = time.monotonic()
    base = baselines(args.clients, args.rows, 16)
    order = [n for i in range(args.repeats) for n in (args.collectors if i % 2 == 0 else args.collectors[::-1])]
    runs = []
    for n in order:
        r = run(n, args.clients, args.batches, args.rows)
        ok = r["stored"] == r["distinct"] == r["expected"] and r["routed_ok"]
        r["ok"] = ok
        runs.append(r)
        print(
            f"{n} collector(s): {r['rate']:,.0f} records/s, {r['elapsed']:.2f} s, collector CPU "
            f"{sum(r['cpu']):.2f} s ({', '.join(f'{c:.2f}' for c in r['cpu'])}), stored {r['stored']:,} / "
            f"{r['expected']:,} {'ok' if ok else 'MISMATCH'}; load {r['load']:.1f}",
            flush=True,
        )
    load1 = os.getloadavg()
    elapsed = time.monotonic() - t_start

    def med(xs):
        return statistics.median(xs)

    rows_tbl, per_rec = [], {}
    rate1 = med([r["rate"] for r in runs if r["n"] == args.collectors[0]])
    for n in args.collectors:
        rs = [r for r in runs if r["n"] == n]
        rates = [r["rate"] for r in rs]
        us = [sum(r["cpu"]) / r["expected"] * 1e6 for r in rs]
        per_rec[n] = med(us)
        cl_us = [r["clients_cpu"] / r["expected"] * 1e6 for r in rs]
        rows_tbl.append(
            f"| {n} | {med(rates):,.0f} [{min(rates):,.0f}-{max(rates):,.0f}] | {med(rates) / rate1:.2f}x | "
            f"{med(us):.2f} [{min(us):.2f}-{max(us):.2f}] | {med(cl_us):.2f} | "
            f"{'; '.join(', '.join(f'{w}: {c:,}' for w, c in r['per_writer']) for r in rs[:1])} | "
            f"{'all ok' if all(r['ok'] for r in rs) else '**MISMATCH**'} |"
        )
    wire = base["wire_bytes_per_record"]
    one = [r for r in runs if r["n"] == args.collectors[0]]
    cost1 = per_rec[args.collectors[0]]
    cores1 = med([sum(r["cpu"]) / r["elapsed"] for r in one])
    rate_1 = med([r["rate"] for r in one])
    disk = med([r["disk_bytes_per_record"] for r in runs])
    cl_cost = med([r["clients_cpu"] / r["expected"] * 1e6 for r in runs])
    ledger = {n: med([r["ledger_lines"] for r in runs if r["n"] == n]) for n in args.collectors}
    per_core = 1e6 / cost1
    cmd = ("python -m benches.ingest_collectors " + " ".join(argv)).strip()
    text = f"""# Ingest with 1, 2 and 4 collectors sharing one data dir

- command: `timeout 600 {cmd}` ({elapsed:.0f} s, ended {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)
- machine: {platform.machine()} {os.cpu_count()}-core CPU VM, shared with other jobs (see the load
  average); load average (1/5/15 min) at start {"/".join(f"{x:.1f}" for x in load0)}, at end
  {"/".join(f"{x:.1f}" for x in load1)}; 1-min load before each configuration: {", ".join(f"{r['n']}: {r['load']:.1f}" for r in runs)}
- rankscope code: {code_version(ROOT)}
- per configuration: a fresh data dir on local disk; n × `rankscope collect --data-dir D --port P_i --writer-id c<i>`;
  {args.clients} client processes (benches/ingest.py's client: one Stream, pre-encoded comm batches, window 8),
  client rank r → collector r % n; {args.batches} envelopes × {args.rows:,} records per client =
  {args.clients * args.batches * args.rows:,} records per configuration; order {", ".join(map(str, order))}
- records/s = records / (last ack − go); acks only after fsync of segment + ledger. Count check after all
  collectors stopped, through the one catalog: rows = distinct (rank, seq) = sent, and each writer id holds exactly
  the ranks routed to it.

| collectors | records/s end to end, median [min-max] | vs 1 collector | collector CPU-µs per record (all collectors) | client CPU-µs per record | rows per writer (first run) | count check |
|---:|---:|---:|---:|---:|---|---|
{chr(10).join(rows_tbl)}

Per run: {"; ".join(f"n={r['n']}: {r['rate']:,.0f}/s" for r in runs)}.

Same-run single-thread baselines on the same rows: protobuf parse + decode to Arrow {base["decode_cpu"]:,.0f}
records per CPU-s, pyarrow zstd Parquet write {base["parquet_cpu"]:,.0f} records per CPU-s. Wire size
{wire:.0f} B/record; on disk {disk:.1f} B/record (zstd Parquet, after compaction). Ledger lines written per
configuration (commits + checkpoints, all writers): {", ".join(f"{n}: {v:.0f}" for n, v in ledger.items())}.

## Reading and scaling model

- **On this machine more collectors cannot help, and they do not**: the whole job (collectors + {args.clients} clients)
  costs ~{cost1 + cl_cost:.2f} CPU-µs per record and the 2 cores are shared with other jobs, so the ceiling is about
  2 / {cost1 + cl_cost:.2f} µs ≈ {2 / (cost1 + cl_cost):.1f} M records/s whatever n is. One collector already uses
  {cores1:.2f} cores during its run (pyarrow's encode and zstd run outside the GIL). Relative to one collector:
  {", ".join(f"{n} → {med([r['rate'] for r in runs if r['n'] == n]) / rate_1:.2f}×" for n in args.collectors)};
  collector CPU per record {" / ".join(f"{per_rec[n]:.2f}" for n in args.collectors)} µs for
  {" / ".join(map(str, args.collectors))} collectors (more writers: more, smaller commits and fsyncs, and more gRPC
  server threads competing for the same 2 cores). Every record arrived exactly once in every configuration, and each
  writer holds exactly the ranks routed to it.
- **Model for separate machines** (one collector per machine, ranks routed by rank % n):
  R(n) = min(n × R_1, n × NIC / {wire:.0f} B, FS_write / {disk:.1f} B, n × commits/s per writer × records per commit).
  From this run one collector costs {cost1:.2f} CPU-µs per record (≈ {per_core / 1e6:.2f} M records per CPU-second) and
  spreads over ~{cores1:.1f} cores, so R_1 ≈ {per_core * cores1 / 1e6:.1f} M records/s per collector machine is the
  figure to plan with until it is measured on an idle multi-core host (a collector on more cores may use more
  of them; not measured). Clients cost {cl_cost:.2f} CPU-µs per record on the ranks' own machines.
- Network: {wire:.0f} B/record on the wire; 10 GbE (~1.2 GB/s usable) carries ~{1.2e9 / wire / 1e6:.0f} M records/s per
  collector, above R_1, so the NIC is not the limit there; 1 GbE (~{0.12e9 / wire / 1e6:.1f} M/s) would be.
- Shared file system: writers share no locks or files (docs/SCALING.md), so they scale until the file system's
  aggregate write bandwidth: {disk:.1f} B/record on disk, so 1 GB/s of NFS/Lustre write takes
  ~{1e9 / disk / 1e6:.0f} M records/s in total. Each commit fsyncs a segment and the writer's ledger; here one
  writer wrote {ledger[args.collectors[0]]:.0f} ledger lines for {args.clients * args.batches * args.rows:,} records
  (~{args.clients * args.batches * args.rows / ledger[args.collectors[0]]:,.0f} records per line), i.e. a few commits per
  second at R_1, so even a 5–10 ms fsync on a network file system costs a few percent. Expect near-linear
  n × R_1 until n × R_1 × {disk:.1f} B approaches the file system's write bandwidth.
"""
    from benches._sections import replace_section

    replace_section(args.out, text)
    print(text)
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
