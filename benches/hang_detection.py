"""Detection latency of a hang, two measures.

**Stuck at default settings** (issue 45; ``--stuck``, the default). Target: a rank that stops
before a collective is named *stuck* <= 5 s after the others began to wait, p90 over 10 hangs on a
quiet machine, <= 8 s beside a 2-process CPU hog (``--hog 2``); critical at hang_after_s (60 s).
Method: a real ``rankscope collect`` process and 2 gloo ranks with the hook attached and no
hang_after_s (the default, 60 s). Each round the ranks run ``LEARN`` quick all_reduces (the run's
normal), then rank 0 writes its entry time and enters an all_reduce that rank 1 reaches only
``--stall`` s later. This process asks the live collector (collector.data.live_collector.fetch: the
Health RPC ``rankscope health`` asks first) every 0.1 s until a stuck finding naming rank 1 shows;
time to stuck = first seen - rank 0's entry. Each round also times ``rankscope health RUN`` as a
fresh process while the collective is stuck (the whole command a person runs). With
``--critical``, a last round stalls ``hang_after_s + 5`` s: the time to the critical hang through
the live collector and, as the same run's baseline, through the data dir (findings.for_run, what
``rankscope health`` computed before: the only path at default settings until now). With
``--alerts``, the collector also posts to a local webhook receiver (``--alert-webhook``) and serves
``/metrics``, scraped every 0.1 s: each round's delay from the Health RPC's first stuck answer to the
webhook post of that collective (its arrival) and to the first scrape showing
``rankscope_findings{kind="stuck",severity="warning"}`` (its end). Target: within 1 s of health's.

**hang_after_s elapsed -> visible** (``--hang-after H``, the measure before issue 45): target p95
<= 2 s over 20 injected hangs.

2 gloo ranks with ``collector.hook.attach(hang_after_s=H)`` stream to a real collector
started in this process. Each round, rank 1 sleeps ``H + 3`` s before an all_reduce that
rank 0 has entered (rank 0 writes its entry time first); this process polls the catalog
every 50 ms with the same query and rule ``rankscope health`` runs (queries.hangs ->
findings.hang.stuck_collectives; the CLI adds only its process start) until the hang of
that round's seq shows. Latency = first seen - (rank 0's entry + H). Baseline in the same
run: the store's own visibility delay (a heartbeat's time to visible in the catalog), the
floor any catalog-based detection pays.

    python -m benches.hang_detection [--hangs 10 --stall 10 --hog 0 --critical --alerts]
    python -m benches.hang_detection --hang-after 1.0 [--hangs 20]
Writes (appends a section to) benches/RESULTS-hang-detection.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import tempfile
import threading
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
    p.add_argument("--hangs", type=int, default=None, help="rounds (default 10 stuck, 20 with --hang-after)")
    p.add_argument("--hang-after", type=float, default=None, help="the old measure: hang_after_s of the ranks")
    p.add_argument("--stall", type=float, default=10.0, help="--stuck: s rank 1 stays away each round")
    p.add_argument("--hog", type=int, default=0, help="--stuck: CPU-bound processes beside the job")
    p.add_argument("--critical", action="store_true", help="--stuck: a last round to the critical hang (65 s)")
    p.add_argument("--alerts", action="store_true", help="--stuck: time the webhook and /metrics against health")
    p.add_argument("--out", default=str(HERE / "RESULTS-hang-detection.md"))
    args = p.parse_args()
    if args.hang_after is None:
        stuck_main(args)
    else:
        args.hangs = args.hangs or 20
        hang_after_main(args)


LEARN = 40  # quick all_reduces each round before the stall (at least; the first round runs WARM_UP_S)
WARM_UP_S = 5.0


def _stuck_rank(rank: int, port: int, endpoint: str, out: str, hangs: int, stall_s: float, critical: bool) -> None:
    import torch
    import torch.distributed as dist

    from collector import hook

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    hook.attach(run="bench-stuck", endpoint=endpoint)  # default settings: hang_after_s 60 s
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    t = torch.ones(4)
    for i in range(hangs + int(critical)):
        go, n = Path(out, f"go{i}"), 0
        while True:  # at least LEARN quick all_reduces, then on together once the bench says go
            dist.all_reduce(t)
            seen = torch.tensor([float(go.exists())])
            dist.all_reduce(seen, op=dist.ReduceOp.MIN)
            n += 1
            if n >= LEARN and seen.item():
                break
            time.sleep(0.01)
        if rank == 0:
            Path(out, f"entered{i}").write_text(str(time.time()))
        else:
            time.sleep(70.0 if i == hangs else stall_s)
        dist.all_reduce(t)
    hook.detach()
    dist.destroy_process_group()


def _hog() -> None:
    while True:
        pass


class _AlertWatch:
    """The collector's alert webhook and /metrics, watched beside the Health RPC: a local webhook
    receiver (collector.testing.webhook) takes its posts, and a poller scrapes /metrics every
    ``SCRAPE_S``, noting each scrape's start, end and stuck warnings."""

    SCRAPE_S = 0.1
    STUCK = re.compile(r'^rankscope_findings\{(?=[^}]*kind="stuck")(?=[^}]*severity="warning")[^}]*\} (\S+)$', re.M)

    def __init__(self) -> None:
        from collector.testing.webhook import WebhookReceiver

        self.webhook = WebhookReceiver()
        self.scrapes: list[tuple[float, float, float]] = []  # (start, end, stuck warnings)
        self.failures: list[str] = []  # scrapes that got no answer: what went wrong
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def posted(self, seq: int) -> float | None:
        """When the first post of the stuck collective ``seq`` arrived, if one did."""
        for arrived, body in zip(list(self.webhook.arrivals), list(self.webhook.bodies), strict=False):
            finding = body["finding"]
            if finding["kind"] == "stuck" and finding["evidence"]["seq"] == seq:
                return arrived
        return None

    def collect_args(self) -> tuple[str, ...]:
        return ("--alert-webhook", self.webhook.url, "--metrics-port", "0")

    def scrape(self, port: int) -> None:
        def poll():
            import urllib.request

            while not self._stop.wait(self.SCRAPE_S):
                start = time.time()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                        text = reply.read().decode()
                except OSError as exc:  # counted and told; Prometheus, too, scrapes again at its next interval
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                self.scrapes.append((start, time.time(), sum(float(v) for v in self.STUCK.findall(text))))

        self._poller = threading.Thread(target=poll, daemon=True)
        self._poller.start()

    def metrics_shown(self, after: float) -> float | None:
        """The end of the first scrape begun after ``after`` that showed a stuck warning."""
        return next((end for start, end, stuck in list(self.scrapes) if start >= after and stuck), None)

    def close(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(15)
        self.webhook.close()


def stuck_main(args) -> None:
    import multiprocessing
    import subprocess
    import sys

    import torch.multiprocessing as mp

    from collector.data.live_collector import fetch
    from collector.testing.ports import free_port
    from collector.tools.launch import CollectorProcess

    hangs = args.hangs or 10
    hogs = [multiprocessing.get_context("spawn").Process(target=_hog, daemon=True) for _ in range(args.hog)]
    for h in hogs:
        h.start()
    loads = [os.getloadavg()[0]]
    started = time.time()
    named, cli_s, critical = [], [], {}
    alerts = _AlertWatch() if args.alerts else None
    to_webhook, to_metrics = [], []  # per round: s from health's first stuck answer
    with tempfile.TemporaryDirectory() as tmp:
        data_dir, out = Path(tmp) / "data", Path(tmp) / "out"
        out.mkdir()
        collector = CollectorProcess(data_dir, *(alerts.collect_args() if alerts else ()))
        if alerts:
            alerts.scrape(collector.metrics_port)
        ctx = mp.start_processes(
            _stuck_rank,
            args=(free_port(), collector.address, str(out), hangs, args.stall, args.critical),
            nprocs=2,
            join=False,
            start_method="spawn",
        )
        try:
            while fetch(data_dir, "bench-stuck") is None:  # the collector follows the run
                time.sleep(0.2)
            time.sleep(WARM_UP_S)  # the run's first seconds of steps: what the collector learns from

            def stuck_now():  # None: no answer (the RPC timed out), not "nothing stuck"
                answer = fetch(data_dir, "bench-stuck")
                return [f for f in answer.findings if f["kind"] in ("stuck", "hang")] if answer else None

            for i in range(hangs + int(args.critical)):
                while (now := stuck_now()) is None or now:  # the previous round's collective left flight
                    time.sleep(0.1)
                (out / f"go{i}").write_text("")
                entered_file = out / f"entered{i}"
                while not entered_file.exists():
                    time.sleep(0.01)
                entered = float(entered_file.read_text())
                if i == hangs:  # to the critical hang: live, and the data dir as today
                    critical = _to_critical(data_dir, entered, stuck_now)
                    continue
                seen = hit = None
                while time.time() < entered + args.stall:
                    hit = next((f for f in stuck_now() or () if 1 in f["evidence"].get("missing_ranks", ())), None)
                    if hit is not None:
                        seen = time.time()
                        break
                    time.sleep(0.1)
                named.append((seen or float("inf")) - entered)
                if alerts and seen is not None:  # the post and the scrapes come on threads of their own
                    seq = hit["evidence"]["seq"]
                    while (alerts.posted(seq) is None or alerts.metrics_shown(entered) is None) and (
                        time.time() < entered + args.stall
                    ):
                        time.sleep(0.05)
                    posted, shown = alerts.posted(seq), alerts.metrics_shown(entered)
                    to_webhook.append(float("inf") if posted is None else posted - seen)
                    to_metrics.append(float("inf") if shown is None else shown - seen)
                if seen is not None and time.time() < entered + args.stall - 3:
                    t0 = time.perf_counter()
                    subprocess.run(
                        [sys.executable, "-m", "collector.tools.cli", "health", "bench-stuck", "--data-dir",
                         str(data_dir)], capture_output=True, timeout=60,
                    )  # fmt: skip
                    cli_s.append(time.perf_counter() - t0)
                print(f"round {i + 1}/{hangs}: stuck named {named[-1]:.2f} s after the wait began", flush=True)
                if i == hangs // 2:
                    loads.append(os.getloadavg()[0])
            while not ctx.join(timeout=1.0):
                pass
        finally:
            for pid in (p.pid for p in ctx.processes if p.is_alive()):
                os.kill(pid, 9)
            if alerts:  # first: a scrape the stopping collector cuts off is no failure of /metrics
                alerts.close()
            collector.stop()
            for h in hogs:
                h.kill()
    loads.append(os.getloadavg()[0])
    ok = [x for x in named if x != float("inf")]
    command = f"python -m benches.hang_detection --hangs {hangs} --stall {args.stall:g}"
    command += f"{f' --hog {args.hog}' if args.hog else ''}{' --critical' if args.critical else ''}"
    command += " --alerts" if args.alerts else ""
    lines = [
        "",
        f"## Stuck at default settings{f', beside a {args.hog}-process CPU hog' if args.hog else ''} (issue 45)",
        "",
        f"- command: `{command}` ({time.time() - started:.0f} s, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"
        " UTC)",
        f"- machine: {platform.machine()} {os.cpu_count()}-core CPU VM shared with other jobs; 1-minute load "
        f"average {' -> '.join(f'{x:.1f}' for x in loads)} (start -> middle -> end); "
        f"Python {platform.python_version()}",
        f"- rankscope code: {code_version(ROOT)}",
        f"- a real `rankscope collect`, 2 gloo ranks, hook attached with no hang_after_s (60 s); each round {LEARN} "
        f"quick all_reduces, then rank 1 stays away {args.stall:g} s from one; the live collector asked every 0.1 s"
        + ("; the collector posts alerts to a local webhook receiver; /metrics scraped every 0.1 s" * args.alerts),
        "",
        "| measure | rounds | p50 (s) | p90 (s) | max (s) | target |",
        "|---|---:|---:|---:|---:|---|",
        f"| time to stuck: the others' wait began -> stuck finding naming rank 1 | {len(ok)}/{len(named)} | "
        + (f"{_pct(ok, 0.5):.2f} | {_pct(ok, 0.9):.2f} | {max(ok):.2f} |" if ok else "- | - | - |")
        + f" p90 <= {8 if args.hog else 5} s |",
    ]
    if cli_s:
        lines.append(
            f"| `rankscope health RUN` (fresh process, live collector) while stuck | {len(cli_s)} | "
            f"{_pct(cli_s, 0.5):.2f} | {_pct(cli_s, 0.9):.2f} | {max(cli_s):.2f} | <= 0.3 s quiet |"
        )
    for what, delays in (
        ("alert webhook: health's first stuck answer -> the post of that collective arrived", to_webhook),
        ('/metrics: health\'s first stuck answer -> a scrape showed `rankscope_findings{kind="stuck"}`', to_metrics),
    ):
        got = [x for x in delays if x != float("inf")]
        if delays:
            lines.append(
                f"| {what} | {len(got)}/{len(delays)} | "
                + (f"{_pct(got, 0.5):.2f} | {_pct(got, 0.9):.2f} | {max(got):.2f} |" if got else "- | - | - |")
                + " <= 1 s |"
            )
    for what, t in critical.items():
        lines.append(f"| {what} | 1 | {t:.2f} | | | |")
    if alerts and alerts.failures:
        lines.append(
            f"\n/metrics scrapes that got no answer: {len(alerts.failures)} of "
            f"{len(alerts.failures) + len(alerts.scrapes)} (first: {alerts.failures[0]})"
        )
    text = "\n".join(lines) + "\n"
    with open(args.out, "a") as f:
        f.write(text)
    print(text)


def _to_critical(data_dir: Path, entered: float, stuck_now) -> dict[str, float]:
    """The last round: when the live collector and the data dir (today's only path at default
    settings) name the critical hang."""
    from collector.data import findings, queries

    times: dict[str, float] = {}
    while time.time() < entered + 70 and len(times) < 2:
        if "live" not in times and any(f["severity"] == "critical" for f in stuck_now() or ()):
            times["live"] = time.time() - entered
        if "data" not in times:
            try:
                cat = queries.Catalog(data_dir)
                try:
                    run_id = queries.resolve_run(cat.con, "bench-stuck")
                    if any(f.kind == "hang" for f in findings.for_run(cat, run_id)):
                        times["data"] = time.time() - entered
                finally:
                    cat.close()
            except (queries.DataDirError, queries.UnknownRun):
                pass
        time.sleep(0.2)
    return {
        "critical hang, live collector (the others' wait began -> named)": times.get("live", float("inf")),
        "baseline, same run: critical hang through the data dir (findings.for_run, as `rankscope health` "
        "before issue 45)": times.get("data", float("inf")),
    }


def hang_after_main(args) -> None:
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
    with open(args.out, "a") as f:
        f.write("\n" + "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
