"""Readers see snapshots: while a collector process flushes, compacts and rolls up steps every
0.1 s under streaming load, every read -- ``rankscope sql``'s guarded path, the dashboard's catalog (which
health and /metrics use too) and ``catalog.connect`` (export, the tools) --
sees per-run rows that are exactly a set of whole acknowledged-or-in-flight envelopes: every
envelope acked before the read began, no envelope twice or in part, no error.

Each envelope k of run r carries ROWS comm rows with ``seq`` in [k*ROWS, (k+1)*ROWS), so a read's
``GROUP BY run_id, seq // ROWS`` says which envelopes it saw and whether each was whole.
The collector's background compactor (a nice +10 thread) is left idle; the test asks for
compaction passes one after the other while it reads (SIGUSR1, ``CollectorProcess.compact_now``: a
pass on the collector's main thread), so merges and rollups happen during the reads whatever the
host's load, and the test waits on the collector's word that each pass is done, not on luck.
The runs stream for the read loop's length, ``RANKSCOPE_SNAPSHOT_TEST_S`` (default 8 s); reads go on
while the passes still asked for then finish."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import grpc
import pyarrow as pa

from collector.data import catalog, queries
from collector.testing.fake_runs import comm_envelope, hello
from collector.testing.streams import RawStream
from collector.tools.launch import CollectorProcess

RUNS = ("snap-a", "snap-b", "snap-c")
ROWS = 200  # rows per envelope
WINDOW = 16  # envelopes in flight per stream
RATE = 60  # envelopes a second per stream, at most (a quiet 2-core host streams ~130 unpaced)
READ_FOR_S = float(os.environ.get("RANKSCOPE_SNAPSHOT_TEST_S", "8"))
MIN_PASSES = 2  # compaction passes (each merges, rolls up, retires) done while reading, at least
MIN_READS = 10  # reads of each kind, at least (on a loaded host a round of reads takes ~1 s)
PASS_BOUND_S = 120  # the wait for one asked-for pass, on a loaded host
SQL = f"""SELECT run_id, seq // {ROWS} AS env, count(*) AS n, count(DISTINCT seq) AS d
          FROM comm GROUP BY ALL"""


class Sender(threading.Thread):
    """One client streaming envelopes 1, 2, ... of one run, at most WINDOW unacked at a time."""

    def __init__(self, endpoint: str, run_id: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.run_id, self.stop = run_id, stop
        self.channel = grpc.insecure_channel(endpoint)
        self.stream = RawStream(self.channel)
        self.sent = 0

    def acked(self) -> set[int]:
        """The comm envelopes acked (envelope k is the stream's seq k + 1, after the Hello)."""
        with self.stream._cond:
            return {seq - 1 for seq in self.stream.acked if seq > 1}

    def run(self) -> None:
        # a one-rank run: its steps settle as it goes, so the collector rolls them up meanwhile
        self.stream.send(hello(f"c-{self.run_id}", 1, self.run_id, 0, 1))
        started = time.monotonic()
        while not self.stop.is_set() and not self.stream.done.is_set():
            # at most RATE envelopes a second, so the rows a pass merges do not grow with the host's speed
            if self.sent - len(self.acked()) >= WINDOW or self.sent >= RATE * (time.monotonic() - started):
                time.sleep(0.002)
                continue
            self.sent += 1
            k = self.sent
            self.stream.send(comm_envelope(f"c-{self.run_id}", k + 1, self.run_id, 0, k * ROWS, ROWS, group_size=1))
        self.stream.finish(60)
        self.channel.close()


def _check(rows: pa.Table | list[tuple], acked_before: dict[str, set[int]], sent_after: dict[str, int]) -> list[str]:
    problems = []
    seen: dict[str, set[int]] = {r: set() for r in RUNS}
    for run_id, env, n, d in rows:
        if run_id not in seen:
            problems.append(f"unknown run {run_id}")
            continue
        seen[run_id].add(env)
        if n != ROWS or d != ROWS:
            problems.append(f"{run_id} envelope {env}: {n} rows ({d} distinct), expected {ROWS}")
        if not 1 <= env <= sent_after[run_id]:
            problems.append(f"{run_id} envelope {env} was never sent")
    for run_id in RUNS:
        missing = acked_before[run_id] - seen[run_id]
        if missing:
            problems.append(f"{run_id}: {len(missing)} acked envelopes missing ({len(missing) * ROWS} rows)")
    return problems


def _merged(data: Path) -> list[Path]:
    return list((data / "parquet" / "comm").glob("run=*/cmp-*.parquet"))


def _rolled(data: Path) -> list[Path]:
    return list((data / "parquet" / "comm_steps").glob("run=*/*.parquet"))


def _compacted(data: Path) -> bool:
    return bool(_merged(data)) and bool(_rolled(data))


def test_every_read_during_flushes_and_compaction_sees_a_whole_committed_state(tmp_path):
    data = tmp_path / "data"
    args = ("--flush-interval", "0.05", "--compaction-interval", "3600", "--compaction-min-files", "2")
    with CollectorProcess(data, *args) as collector:
        stop = threading.Event()
        senders = [Sender(collector.address, r, stop) for r in RUNS]
        for s in senders:
            s.start()
        while any(not s.acked() for s in senders):  # the partitions (and the catalog) exist
            time.sleep(0.05)
        catalog.ensure_catalog(data)
        cat = queries.Catalog(data)
        reads, failures = {"sql": 0, "catalog": 0, "connect": 0}, []
        passes: list[int | str] = []  # merges of each asked-for pass, or why it failed

        def ask_for_passes() -> None:
            while time.monotonic() < deadline or len(passes) < MIN_PASSES:
                try:
                    passes.append(collector.compact_now(PASS_BOUND_S))
                except (TimeoutError, RuntimeError) as exc:
                    passes.append(str(exc))
                    return

        deadline = time.monotonic() + READ_FOR_S
        asker = threading.Thread(target=ask_for_passes, daemon=True)
        asker.start()
        # read for READ_FOR_S and on until MIN_PASSES passes are done (each bounded above) and each
        # kind of read was made MIN_READS times (9 in a fresh clone beside a hog, at load 12)
        while time.monotonic() < deadline or asker.is_alive() or min(reads.values()) < MIN_READS:
            if time.monotonic() >= deadline:
                # The streams end with the read window; the passes still asked for then merge what
                # came. Streaming on until they were done, a loaded host (load 16) never caught up:
                # each pass's ingest (GIL, CPU) starved it and gave the next more to merge (4-5M
                # rows, the second pass over 120 s, h2 beside a hog and 2/2 beside 8 busy loops).
                stop.set()
            for kind in reads:
                acked = {s.run_id: s.acked() for s in senders}
                try:
                    if kind == "sql":
                        table = catalog.run_readonly_query(data, SQL, max_rows=None)
                        rows = list(zip(*(table[c].to_pylist() for c in ("run_id", "env", "n", "d")), strict=True))
                    elif kind == "catalog":
                        rows = list(cat.df(SQL, []).itertuples(index=False, name=None))
                        cat.df("SELECT count(*) FROM comm_steps JOIN runs USING (run_id)", [])  # rollups: no error
                    else:
                        con = catalog.connect(data)
                        try:
                            rows = con.execute(SQL).fetchall()
                        finally:
                            con.close()
                except Exception as exc:
                    failures.append(f"{kind} read {reads[kind]}: {type(exc).__name__}: {str(exc)[:300]}")
                    reads[kind] += 1
                    continue
                sent = {s.run_id: s.sent for s in senders}
                failures += [f"{kind} read {reads[kind]}: {p}" for p in _check(rows, acked, sent)]
                reads[kind] += 1
        stop.set()
        for s in senders:
            s.join(60)
        cat.close()
        merges = collector.stderr()
    merged, rolled = _merged(data), _rolled(data)
    acked_total = sum(len(s.acked()) for s in senders)
    load = f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    print(f"reads {reads}, envelopes acked {acked_total}, rows {acked_total * ROWS}, passes {passes}, {load}")
    assert acked_total > 100, f"the load did not flow: {acked_total} envelopes acked ({load}); {merges}"
    problems = [p for p in passes if isinstance(p, str)]
    assert not problems, f"an asked-for compaction pass did not happen: {problems[0]}"
    assert merged and sum(passes) > 0, f"passes {passes} merged nothing: no compaction happened while reading"
    assert rolled, f"no rollup after {len(passes)} passes ({load})"
    assert not failures, f"{len(failures)} bad reads of {sum(reads.values())}:\n" + "\n".join(failures[:20])
