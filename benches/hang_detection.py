"""Detection latency of a hang: from ``hang_after_s`` elapsing to the hang being visible in
the findings ``rankscope health`` prints. Target: p95 <= 2 s over 20 injected hangs.

2 gloo ranks with ``collector.hook.attach(hang_after_s=H)`` stream to a real collector
started in this process. Each round, rank 1 sleeps ``H + 3`` s before an all_reduce that
rank 0 has entered (rank 0 writes its entry time first); this process polls the catalog
every 50 ms with the same query and rule ``rankscope health`` runs (queries.hangs ->
findings.hang.stuck_collectives; the CLI adds only its process start) until the hang of
that round's seq shows. Latency = first seen - (rank 0's entry + H). Baseline in the same
run: the store's own visibility delay (a heartbeat's time to visible in the catalog), the
floor any catalog-based detection pays.

    python -m benches.hang_detection [--hangs 20 --hang-after 1.0]
Writes benches/RESULTS-hang-detection.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

from benches._common import code_version

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _rank(rank: int, port: int, endpoint: str, out: str, hangs: int, hang_after_s: float) -> None:
    import torch
    import torch.distributed as dist

    from collector import hook

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    hook.attach(run="bench-hang-detection", endpoint=endpoint, hang_after_s=hang_after_s)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    t = torch.ones(4)
    for i in range(hangs):
        dist.all_reduce(t)  # seq 2i+1: back in step
        if rank == 0:
            Path(out, f"entered{i}").write_text(str(time.time()))
        else:
            time.sleep(hang_after_s + 3.0)
        dist.all_reduce(t)  # seq 2i+2: the hang
    hook.detach()
    dist.destroy_process_group()


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benches.hang_detection", description=__doc__.split("\n")[0])
    p.add_argument("--hangs", type=int, default=20)
    p.add_argument("--hang-after", type=float, default=1.0, help="hang_after_s of the ranks")
    p.add_argument("--out", default=str(HERE / "RESULTS-hang-detection.md"))
    args = p.parse_args()

    import torch.multiprocessing as mp

    from collector.data import queries
    from collector.data.findings.hang import stuck_collectives
    from collector.testing.collectors import live_collector
    from collector.testing.ports import free_port

    loads = [os.getloadavg()[0]]
    started = time.time()
    latencies, visibility = [], []
    with tempfile.TemporaryDirectory() as tmp, live_collector(Path(tmp) / "data") as collector:
        out = Path(tmp) / "out"
        out.mkdir()
        ctx = mp.start_processes(
            _rank,
            args=(free_port(), collector.endpoint, str(out), args.hangs, args.hang_after),
            nprocs=2,
            join=False,
            start_method="spawn",
        )
        cat = None
        for i in range(args.hangs):
            entered_file = out / f"entered{i}"
            while not entered_file.exists():
                time.sleep(0.01)
            due = float(entered_file.read_text()) + args.hang_after
            seq = 2 * i + 2
            seen = None
            while time.time() < due + 30:
                if cat is None:
                    try:
                        cat = queries.Catalog(collector.data_dir)
                        run_id = queries.list_runs(cat).run_id.iloc[0]
                    except (queries.DataDirError, IndexError):
                        cat = None
                        time.sleep(0.05)
                        continue
                found = stuck_collectives(queries.hangs(cat, run_id))
                if any(f.evidence["seq"] == seq for f in found):
                    seen = time.time()
                    break
                time.sleep(0.05)
            if seen is None and cat is not None:
                print(
                    cat.df(
                        "SELECT rank, group_name, seq, op, state, (time_ns - entered_ns) / 1e9 AS w FROM inflight "
                        "WHERE run_id = ? ORDER BY time_ns DESC LIMIT 5",
                        [run_id],
                    ).to_string(),
                    flush=True,
                )
            latencies.append((seen or float("inf")) - due)
            beats = cat.df("SELECT max(time_ns) / 1e9 AS t FROM heartbeats WHERE run_id = ?", [run_id]).t.iloc[0]
            visibility.append(time.time() - beats)  # how old the newest visible beat is: <= delivery + 1 period
            print(f"hang {i + 1}/{args.hangs}: seen {latencies[-1]:+.2f} s after hang_after_s", flush=True)
            if i == args.hangs // 2:
                loads.append(os.getloadavg()[0])
        while not ctx.join(timeout=1.0):
            pass
        cat.close()
    loads.append(os.getloadavg()[0])
    ok = [x for x in latencies if x != float("inf")]
    lines = [
        "## Hang detection latency",
        "",
        f"- command: `python -m benches.hang_detection --hangs {args.hangs} --hang-after {args.hang_after:g}` "
        f"({time.time() - started:.0f} s, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC)",
        f"- machine: {platform.machine()} {os.cpu_count()}-core CPU VM shared with other jobs; 1-minute load "
        f"average {' -> '.join(f'{x:.1f}' for x in loads)} (start -> middle -> end); "
        f"Python {platform.python_version()}",
        f"- rankscope code: {code_version(ROOT)}",
        "- 2 gloo ranks, hook attached, heartbeat 1 s; rank 1 sleeps hang_after_s + 3 s before the hang's all_reduce;"
        " collector in-process (store flush 50 ms); polled every 50 ms with the query and rule of `rankscope health`",
        "",
        "| measure | hangs | p50 (s) | p95 (s) | max (s) | target |",
        "|---|---:|---:|---:|---:|---|",
        f"| detection: hang_after_s elapsed -> finding visible | {len(ok)}/{len(latencies)} | "
        f"{_pct(ok, 0.5):.2f} | {_pct(ok, 0.95):.2f} | {max(ok):.2f} | p95 <= 2 s |",
        f"| baseline, same run: age of the newest visible heartbeat when each hang was seen | {len(visibility)} | "
        f"{_pct(visibility, 0.5):.2f} | {_pct(visibility, 0.95):.2f} | {max(visibility):.2f} | "
        "(<= 1 period + delivery) |",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
