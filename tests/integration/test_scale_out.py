"""Two collector processes, two ports, one data dir: each writes under its own
writer id (segment names, ledger), ranks are routed to one of them, and one
catalog sees every record exactly once -- also after one of them is SIGKILLed
mid-stream and restarted (its recovery leaves the other's files alone)."""

from __future__ import annotations

import signal
import threading

import grpc
import pytest

from collector.data import catalog, layout
from collector.server.ledger import DataDirBusy, Ledger
from collector.testing.fake_runs import comm_envelope, hello, run_end
from collector.testing.streams import RawStream
from collector.tools.launch import CollectorProcess

FAST = ("--flush-interval", "0.02", "--compaction-interval", "0.1", "--compaction-min-files", "3")

RANKS, ENVELOPES, ROWS = 8, 30, 50
WRITERS = ("east", "west")


def start(data, writer) -> CollectorProcess:
    return CollectorProcess(data, *FAST, "--writer-id", writer)


def route(rank: int) -> str:
    """Stable routing: a rank (one client_id) always talks to the same collector,
    since deduplication of resends is per writer."""
    return WRITERS[rank % len(WRITERS)]


def envelope(rank: int, seq: int):
    cid = f"rank-{rank}"
    if seq == 1:
        return hello(cid, 1, "shared", rank, RANKS)
    if seq == ENVELOPES + 2:
        return run_end(cid, seq, "shared", rank)
    return comm_envelope(cid, seq, "shared", rank, (seq - 2) * ROWS, ROWS, group_size=RANKS)


def stream_all(ports: dict[str, int], acked: list[set[int]], stop_early: float | None = None) -> None:
    channels = {w: grpc.insecure_channel(f"127.0.0.1:{p}") for w, p in ports.items()}
    streams = []
    for rank in range(RANKS):
        s = RawStream(channels[route(rank)])
        s.send(*(envelope(rank, seq) for seq in range(1, ENVELOPES + 3) if seq not in acked[rank]))
        streams.append(s)
    if stop_early is not None:
        threading.Event().wait(stop_early)
    for rank, s in enumerate(streams):
        if stop_early is None:
            s.finish(timeout=60)
            assert s.error is None, s.error
        acked[rank] |= s.acked
        s.cancel()
    for c in channels.values():
        c.close()


def test_two_collectors_share_one_data_dir_and_one_catalog_sees_both(tmp_path):
    data = tmp_path / "data"
    acked = [set() for _ in range(RANKS)]
    procs = {w: start(data, w) for w in WRITERS}
    try:
        # west dies mid-stream; east keeps going
        stream_all({w: c.port for w, c in procs.items()}, acked, stop_early=0.3)
        procs["west"].kill()
        procs["west"] = start(data, "west")
        stream_all({w: c.port for w, c in procs.items()}, acked)
    finally:
        for c in procs.values():
            c.proc.send_signal(signal.SIGTERM)  # both at once: they shut down side by side
        for c in procs.values():
            assert c.proc.wait(30) == 0

    assert all(a == set(range(1, ENVELOPES + 3)) for a in acked)
    con = catalog.connect(data)
    total, distinct = con.execute("SELECT count(*), count(DISTINCT (rank, seq)) FROM comm").fetchone()
    assert total == distinct == RANKS * ENVELOPES * ROWS
    assert con.execute("SELECT count(*) FROM ranks WHERE status = 'finished'").fetchone() == (RANKS,)
    assert con.execute("SELECT status, n_ranks FROM runs").fetchall() == [("finished", RANKS)]
    # each rank's rows came through its own collector, under that writer's names
    by_writer = con.execute(
        "SELECT regexp_extract(filename, '(seg|cmp)-([a-z]+)-', 2) AS w, list(DISTINCT rank ORDER BY rank) "
        "FROM read_parquet(?, filename = true) GROUP BY w ORDER BY w",
        [f"{data}/parquet/comm/run=shared/*.parquet"],
    ).fetchall()
    assert by_writer == [("east", list(range(0, RANKS, 2))), ("west", list(range(1, RANKS, 2)))]
    assert sorted(p.name for p in (data / "ledger").iterdir() if p.is_dir()) == ["writer=east", "writer=west"]
    leftovers = [p for p in (data / "parquet").rglob(".*") if not p.name.startswith(".schema")]
    assert leftovers == []


def test_a_writer_id_is_exclusive_and_recovery_touches_only_its_own_files(tmp_path):
    data = tmp_path / "data"
    east = Ledger(data, "east")
    with pytest.raises(DataDirBusy, match="writer 'east'"):
        Ledger(data, "east")
    # west's uncommitted temp file survives east's recovery (west may be writing it right now)
    part = layout.partition_dir(data, "comm", "r")
    part.mkdir(parents=True)
    west_tmp = part / ".seg-west-0000000001-0.parquet.tmp"
    east_tmp = part / ".seg-east-0000000001-0.parquet.tmp"
    west_tmp.write_bytes(b"x")
    east_tmp.write_bytes(b"x")
    east.close()
    Ledger(data, "east").close()
    assert west_tmp.exists() and not east_tmp.exists()
    for bad in ("East", "1a", "a-b", "../x", "", "a" * 33):
        with pytest.raises(ValueError, match="writer id"):
            Ledger(data, bad)


def test_a_copied_data_dir_reads_without_the_catalog(tmp_path):
    """The documented recipe (docs/SCALING.md, "Reading a data dir elsewhere"): copy parquet/ to
    another place, no catalog, no ledger, no rankscope -- plain DuckDB with hive_partitioning
    gives the same rows, the run as a column, as the catalog does on the original."""
    import shutil

    import duckdb

    from collector.tools import simulate

    sim = simulate.Simulation(ranks=16, steps=10, stragglers=(simulate.Straggler(5, 30_000_000),), run_id="copied")
    original = tmp_path / "original"
    simulate.write_data_dir(sim, original)
    copy = tmp_path / "elsewhere"
    shutil.copytree(original / "parquet", copy / "parquet")
    assert not (copy / "catalog.duckdb").exists() and not (copy / "ledger").exists()

    con = duckdb.connect()  # the recipe, verbatim but for the path
    counts = con.execute(
        """
        SELECT run, op, count(*) AS n, count(DISTINCT rank) AS ranks
        FROM read_parquet(? || '/parquet/comm/*/*.parquet', hive_partitioning = true)
        GROUP BY run, op ORDER BY op""",
        [str(copy)],
    ).fetchall()
    last = con.execute(
        """
        WITH c AS (SELECT * FROM read_parquet(? || '/parquet/comm/*/*.parquet', hive_partitioning = true))
        SELECT arg_max(rank, start_ns) AS last_rank, count(*) AS n FROM c
        WHERE seq % ? = 0  -- the step's first collective, where everyone waits for the straggler
        GROUP BY run, group_name, seq
        """,
        [str(copy), sim.per_step],
    ).df()
    cat = catalog.connect(str(original))
    expected = cat.execute(
        "SELECT run_id, op, count(*), count(DISTINCT rank) FROM comm GROUP BY run_id, op ORDER BY op"
    ).fetchall()
    cat.close()
    assert counts == expected and counts[0][0] == "copied"
    assert (last.last_rank == 5).all() and (last.n == 16).all()
