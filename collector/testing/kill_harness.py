"""Kill at every point (issue 49): SIGKILL real collectors and real spooling ranks at seeded random
moments, start them again on the same dirs, and check after every kill what a reader sees.

Collector kills (``kill_collectors``). A simulated run (collector.tools.simulate: comm, timers,
memory, ... of 4 ranks, a few steps per envelope) is streamed by one gRPC stream per rank to a
``rankscope collect`` child that flushes every 20 ms, compacts every 50 ms and rolls up (and, with
``raw_every``, thins) settled steps as they come: a kill at a random moment lands in ingest, a
flush, a compaction, a rollup, retention or the metrics refresh reading the catalog. Each kill is
at ``uniform(0, max_delay_s)`` after the streams start (seeded); every round a rank resends what
was not acked, and some envelopes that were (the collector must ack those without storing them
again). After each kill, before the restart, a reader opens the catalog read-only and reads every
view (``reader_errors``) and every segment the ledger's manifest names (``partial_segments``: one
that does not open, or that lies under a temporary name). At the end the run is sent whole,
the collector stopped, and each table's rows counted against what the simulation made: comm
through the reader's own accounting (rolled-up steps from ``comm_steps``' record counts, the rest
raw), so rows lost or stored twice show (``lost_or_doubled``), and the raw comm rows are checked
for duplicate keys.

Rank kills (``kill_ranks``). A rank process spools its records (no collector up) and is killed at a
random moment of its spool writes; then a process resending the orphans to a live collector is
killed at a random moment of the resend; a last resend runs to the end. No half file may be
visible in the spool at any time, and every record of every spool file that was complete is stored
exactly once (a record still in the killed rank's memory is not a loss of the spool's).
"""

from __future__ import annotations

import dataclasses
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import pyarrow.parquet as pq

from collector.data import catalog, layout
from collector.testing.streams import RawStream
from collector.tools.importers.sink import envelope, table_batches
from collector.tools.launch import CollectorProcess
from collector.tools.simulate.simulation import Simulation

FAST = ("--flush-interval", "0.02", "--compaction-interval", "0.05", "--compaction-min-files", "2")
ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class KillReport:
    kills: int = 0
    killed_with_unacked: int = 0  # kills that left some rank with envelopes not yet acked
    envelopes: int = 0
    rows_expected: int = 0
    rows_stored: int = 0
    resent_acked: int = 0  # envelopes sent again after their ack (dedupe exercised)
    reader_errors: list[str] = dataclasses.field(default_factory=list)
    partial_segments: list[str] = dataclasses.field(default_factory=list)
    lost_or_doubled: list[str] = dataclasses.field(default_factory=list)
    restart_errors: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.reader_errors or self.partial_segments or self.lost_or_doubled or self.restart_errors)

    def problems(self) -> str:
        return "; ".join(self.reader_errors + self.partial_segments + self.lost_or_doubled + self.restart_errors)


def workload(seed: int, ranks: int = 4, steps: int = 24, steps_per_envelope: int = 2):
    """The simulated run: each rank's envelopes (Hello, its tables a few steps at a time, RunEnd),
    and the rows each table should end with."""
    sim = Simulation(ranks=ranks, steps=steps, run_id=f"kills-{seed}", name="kills", seed=seed)
    per_rank: list[list] = []
    expected: dict[str, int] = {}
    for rank in range(ranks):
        client = sim.client_id(rank)
        envs = [envelope(client, 1, hello=sim.hello(rank))]
        tables = sim.block(rank, 1)
        for lo in range(0, steps, steps_per_envelope):
            for table, rows in tables.items():
                if "step" not in rows.column_names:
                    continue
                step = rows.column("step").to_numpy()
                part = rows.filter((step >= lo) & (step < lo + steps_per_envelope))
                if part.num_rows:
                    expected[table] = expected.get(table, 0) + part.num_rows
                    for batch in table_batches(table, sim.run_id, rank, part):
                        envs.append(envelope(client, len(envs) + 1, table=batch))
        envs.append(envelope(client, len(envs) + 1, end=sim.run_end(rank)))
        per_rank.append(envs)
    return sim, per_rank, expected


def _send_round(port: int, per_rank, acked: list[set[int]], rng: random.Random, report: KillReport, kill_at):
    """Every rank streams what has no ack (and a few envelopes that have one); returns when all
    are acked, or once ``kill_at`` (a monotonic time) has passed."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    streams = []
    try:
        for rank, envs in enumerate(per_rank):
            again = {e.seq for e in envs if e.seq in acked[rank] and rng.random() < 0.1}
            report.resent_acked += len(again)
            todo = [e for e in envs if e.seq not in acked[rank] or e.seq in again]
            s = RawStream(channel)
            streams.append((rank, s, todo))

            def pump(s=s, todo=todo):
                for env in todo:
                    if s.done.is_set():
                        return
                    s.send(env)
                    time.sleep(0.002)

            threading.Thread(target=pump, daemon=True).start()
        deadline = kill_at if kill_at is not None else time.monotonic() + 120
        while time.monotonic() < deadline:
            if all({e.seq for e in todo} <= s.acked for _, s, todo in streams):
                break
            time.sleep(0.005)
    finally:
        for rank, s, _ in streams:
            acked[rank] |= s.acked
            s.cancel()
        channel.close()


def check_readers(data_dir: Path, report: KillReport, when: str) -> None:
    """Read every view and every segment the manifest names, as a reader would right now."""
    try:
        con = catalog.connect(data_dir)
    except Exception as e:
        report.reader_errors.append(f"{when}: catalog does not open: {e!r}")
        return
    try:
        views = [r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]
        for view in views:
            try:
                con.execute(f'SELECT count(*) FROM "{view}"').fetchone()
            except Exception as e:
                report.reader_errors.append(f"{when}: view {view}: {e!r}"[:300])
    finally:
        con.close()
    manifest = data_dir / "ledger" / "manifest.json"
    if not manifest.exists():
        return
    import json

    try:
        listed = json.loads(manifest.read_text())
    except ValueError as e:
        report.partial_segments.append(f"{when}: manifest.json unreadable: {e}")
        return
    for table, files in listed.get("tables", {}).items():
        for rel in files:
            path = data_dir / rel
            if path.name.endswith(layout.TEMP_SUFFIX):
                report.partial_segments.append(f"{when}: {table}: {rel} listed under a temporary name")
            try:
                pq.ParquetFile(path).metadata.num_rows  # noqa: B018 - opening it is the check
            except FileNotFoundError:
                continue  # retired since the manifest was read: readers retry on the new manifest
            except Exception as e:
                report.partial_segments.append(f"{when}: {table}: {rel} does not open: {e!r}"[:300])


def count_stored(data_dir: Path, run_id: str) -> dict[str, int]:
    """Rows per table as readers count them; comm: rolled-up steps by their record counts."""
    con = catalog.connect(data_dir)
    try:
        out = {}
        for (table,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall():
            cols = [c[0] for c in con.execute(f'DESCRIBE "{table}"').fetchall()]
            if "run_id" in cols and "step" in cols and "rank" in cols:
                out[table] = con.execute(f'SELECT count(*) FROM "{table}" WHERE run_id = ?', [run_id]).fetchone()[0]
        through = con.execute("SELECT coalesce(max(step), -1) FROM comm_steps WHERE run_id = ?", [run_id]).fetchone()[0]
        rolled = con.execute("SELECT coalesce(sum(n), 0) FROM comm_steps WHERE run_id = ?", [run_id]).fetchone()[0]
        fresh = con.execute("SELECT count(*) FROM comm WHERE run_id = ? AND step > ?", [run_id, through]).fetchone()[0]
        out["comm (reader's count)"] = int(rolled) + int(fresh)
        total, distinct = con.execute(
            "SELECT count(*), count(DISTINCT (rank, group_name, seq)) FROM comm WHERE run_id = ?", [run_id]
        ).fetchone()
        out["comm duplicate keys"] = total - distinct
        return out
    finally:
        con.close()


def kill_collectors(
    data_dir: Path,
    kills: int,
    seed: int,
    *,
    raw_every: int = 0,
    max_delay_s: float = 1.5,
    steps: int = 12,
    new_run_every: int = 2,
    log=None,
) -> KillReport:
    """``kills`` SIGKILLs of a collector over ``data_dir`` (see the module's docstring). Every
    ``new_run_every`` rounds a new run joins the ones still being (re)sent, so kills keep landing
    in ingest as well as in the compaction and rollups of the runs before it."""
    rng = random.Random(seed)
    runs: list[tuple] = []  # (sim, per_rank envelopes, expected rows per table, acked seqs per rank)
    report = KillReport()
    args = FAST + (("--raw-every", str(raw_every)) if raw_every else ())
    started = time.monotonic()

    def all_envelopes():
        return [env for _, per_rank, _, _ in runs for env in per_rank], [a for *_, acked in runs for a in acked]

    def add_run() -> None:
        sim, per_rank, expected = workload(seed * 10_000 + len(runs), steps=steps)
        runs.append((sim, per_rank, expected, [set() for _ in per_rank]))
        report.envelopes += sum(map(len, per_rank))
        report.rows_expected += sum(expected.values())

    for i in range(kills):
        if i % new_run_every == 0:
            add_run()
        try:
            collector = CollectorProcess(data_dir, *args)
        except RuntimeError as e:
            report.restart_errors.append(f"restart {i}: {e}"[:500])
            break
        delay = rng.uniform(0, max_delay_s)
        envs, acked = all_envelopes()
        try:
            _send_round(collector.port, envs, acked, rng, report, time.monotonic() + delay)
        finally:
            collector.kill()
        report.kills += 1
        report.killed_with_unacked += any(len(a) < len(e) for a, e in zip(acked, envs, strict=True))
        check_readers(data_dir, report, f"after kill {i} (at {delay:.2f} s)")
        if log:
            log(f"kill {i + 1}/{kills} at {delay:.2f} s: {sum(map(len, acked))}/{report.envelopes} acked")
    if not report.restart_errors:
        with CollectorProcess(data_dir, *args) as collector:
            envs, acked = all_envelopes()
            _send_round(collector.port, envs, acked, rng, report, None)
            missing = sum(len(e) - len(a) for a, e in zip(acked, envs, strict=True))
            if missing:
                report.lost_or_doubled.append(f"{missing} envelope(s) never acked after the last restart")
            if collector.stop() != 0:
                report.restart_errors.append(f"the last collector did not stop cleanly: {collector.stderr()}")
        check_readers(data_dir, report, "at the end")
        for sim, _, expected, _ in runs:
            _check_run(data_dir, sim.run_id, expected, raw_every, report)
    report.seconds = time.monotonic() - started
    return report


def _check_run(data_dir: Path, run_id: str, expected: dict[str, int], raw_every: int, report: KillReport) -> None:
    stored = count_stored(data_dir, run_id)
    report.rows_stored += sum(stored.get(t, 0) for t in expected if t != "comm") + stored["comm (reader's count)"]
    for table, n in expected.items():
        got = stored["comm (reader's count)"] if table == "comm" else stored.get(table, 0)
        if table == "comm" and not raw_every and stored["comm"] != n:
            report.lost_or_doubled.append(f"{run_id} comm: {stored['comm']} raw rows stored, {n} sent")
        if got != n:
            report.lost_or_doubled.append(f"{run_id} {table}: {got} rows stored, {n} sent and acked")
    if stored["comm duplicate keys"]:
        report.lost_or_doubled.append(f"{run_id} comm: {stored['comm duplicate keys']} rows stored twice")


# ---- rank side ------------------------------------------------------------------------------------
_SPOOLER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from collector.rank import spool
    from collector.tools.importers.sink import envelope, table_batches
    from collector.testing.kill_harness import workload
    directory, endpoint, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    _, per_rank, _ = workload(seed, ranks=1, steps=40, steps_per_envelope=1)
    envs = per_rank[0]
    client = envs[0].client_id.replace("-", "_")
    import os, socket
    client = f"{spool.local_host_id()}.{os.getpid()}.{client}"
    for env in envs:
        env.client_id = client
    print("spooling", flush=True)
    for lo in range(0, len(envs), 3):  # as a client does: a file per batch of un-acked envelopes
        spool.write(directory, client, envs[lo : lo + 3], endpoint)
""")

_RESENDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from collector.rank.resend import resend_spooled
    print("resending", flush=True)
    resend_spooled(Path(sys.argv[1]), sys.argv[2])
""")


def _run_and_kill(code: str, args: list[str], delay_s: float) -> bool:
    """Run ``code``; SIGKILL it ``delay_s`` after it says it has begun. True if it was killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        proc.stdout.readline()
        try:
            proc.wait(delay_s)
            return False
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            return True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _spooled_rows(directory: Path, report: KillReport, when: str) -> dict[tuple[str, str], int]:
    """Rows per (run, table) in the spool's complete files; a visible file that does not read whole is a problem."""
    from collector.rank import spool

    out: dict[tuple[str, str], int] = {}
    for path in sorted(directory.glob(f"*{spool.SUFFIX}*")):
        if path.name.endswith((".tmp", ".rewrite-tmp", spool.QUARANTINE_SUFFIX)):
            continue  # not a spool file (yet): never read, never resent
        try:
            envs = spool.read(path)
        except FileNotFoundError:
            continue
        except Exception as e:
            report.partial_segments.append(f"{when}: spool file {path.name}: {e}")
            continue
        for env in envs:
            if env.HasField("table"):
                key = (env.table.run_id, env.table.table)
                out[key] = out.get(key, 0) + env.table.rows
    return out


def kill_ranks(work: Path, kills: int, seed: int, *, log=None) -> KillReport:
    """``kills`` rank kills, half mid-spool-write and half mid-resend (see the module's docstring)."""
    from collector.testing.collectors import live_collector

    rng = random.Random(seed)
    report = KillReport()
    started = time.monotonic()
    expected: dict[tuple[str, str], int] = {}  # per (run, table): rows in spool files that were complete
    directory = work / "spool"
    with live_collector(work / "data") as c:
        for i in range(kills):
            if i % 2 == 0:  # a rank killed while it writes its spool files
                run_seed = seed * 1000 + i
                _run_and_kill(_SPOOLER, [str(directory), c.endpoint, str(run_seed)], rng.uniform(0, 1.0))
                run_id = f"kills-{run_seed}"
                now = _spooled_rows(directory, report, f"after spool kill {i}")
                expected.update({key: n for key, n in now.items() if key[0] == run_id})
            else:  # a rank killed while it resends the orphans
                _run_and_kill(_RESENDER, [str(directory), c.endpoint], rng.uniform(0, 0.6))
                _spooled_rows(directory, report, f"after resend kill {i}")
            report.kills += 1
            if log:
                log(f"rank kill {i + 1}/{kills}")
        subprocess.run(
            [sys.executable, "-c", _RESENDER, str(directory), c.endpoint], cwd=ROOT, capture_output=True, timeout=120
        )
        left = _spooled_rows(directory, report, "after the last resend")
        if left:
            report.lost_or_doubled.append(f"rows left in the spool after the last resend: {left}")
        stale = [p.name for p in directory.iterdir() if not p.name.endswith(".quarantined")]
        if stale:
            report.lost_or_doubled.append(f"files left in the spool after the last resend: {stale[:5]}")
        con = catalog.connect(c.data_dir)
        try:
            stored: dict[tuple[str, str], int] = {}
            for table in sorted({t for _, t in expected}):
                for run_id, n in con.execute(f'SELECT run_id, count(*) FROM "{table}" GROUP BY 1').fetchall():
                    stored[(run_id, table)] = n
        finally:
            con.close()
    report.rows_expected, report.rows_stored = sum(expected.values()), sum(stored.get(r, 0) for r in expected)
    for (run_id, table), n in sorted(expected.items()):
        if stored.get((run_id, table), 0) != n:
            got = stored.get((run_id, table), 0)
            report.lost_or_doubled.append(f"{run_id} {table}: {got} rows stored, {n} were spooled")
    report.seconds = time.monotonic() - started
    return report
