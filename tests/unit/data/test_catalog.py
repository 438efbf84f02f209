"""The DuckDB catalog over real segments: views, straggler views, read-only SQL.

Split by tier: what needs processes, sockets or seconds is in tests/integration/data/test_catalog.py."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collector.data import catalog
from collector.data.codec import decode_batch, encode_batch
from collector.data.schema import TABLES
from collector.server.store import Store, StoreConfig
from collector.testing.fake_runs import comm_columns
from collector.tools import sql as sqlcli


def store_comm(data, per_rank: dict[int, dict]) -> None:
    """Commit comm rows through a real Store, as the collector would."""
    store = Store(data, StoreConfig(flush_interval=0.01))
    for seq, (rank, columns) in enumerate(per_rank.items(), start=1):
        rows = decode_batch(encode_batch("comm", "r", rank, columns))
        store.submit("test", seq, [("comm", "r", rows)], lambda err: None)
    store.flush()
    store.close()


def test_every_view_works_on_a_fresh_data_dir(tmp_path):
    catalog.ensure_catalog(tmp_path / "fresh")  # what a collector does first; connect() creates nothing
    con = catalog.connect(tmp_path / "fresh")
    for table, spec in TABLES.items():
        result = con.execute(f'SELECT * FROM "{table}"')
        names = [d[0] for d in result.description]
        assert names[:3] == ["run_id", "rank", "step"] and names[3:] == [c for c, _ in spec.columns[1:]]
        assert result.fetchall() == []
    for view in ("runs", "ranks", "rank_ends", "comm_instances", "stragglers"):
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone() == (0,)
    runs_cols = [d[0] for d in con.execute("SELECT * FROM runs").description]
    assert runs_cols[:6] == ["run_id", "name", "world_size", "started_at", "ended_at", "status"]


def test_the_catalog_is_rebuilt_atomically_when_out_of_date(tmp_path):
    data = tmp_path / "data"
    path = catalog.ensure_catalog(data)
    reader = catalog.connect(data)  # a dashboard holding the old file
    path.unlink()
    catalog.ensure_catalog(data)
    assert reader.execute("SELECT count(*) FROM comm").fetchone() == (0,)
    assert catalog.connect(data).execute("SELECT count(*) FROM stragglers").fetchone() == (0,)


def test_segments_written_before_a_column_existed_read_as_null(tmp_path):
    data = tmp_path / "data"
    catalog.ensure_catalog(data)
    old = pa.table({"rank": pa.array([3], pa.int64()), "step": pa.array([9], pa.int64())})
    (data / "parquet" / "moe" / "run=old").mkdir(parents=True)
    pq.write_table(old, data / "parquet" / "moe" / "run=old" / "seg-0000000001.parquet")
    con = catalog.connect(data)
    assert con.execute("SELECT run_id, rank, step, layer, aux_loss FROM moe").fetchall() == [("old", 3, 9, None, None)]


def test_a_folder_dropped_by_hand_beside_the_run_partitions_is_ignored(tmp_path):
    data = tmp_path / "data"
    store_comm(data, {0: comm_columns(0, 0, 7)})
    stray = data / "parquet" / "comm" / "backup"  # not run=<id>: would break DuckDB's hive scan
    stray.mkdir()
    (stray / "copy.parquet").write_bytes(next((data / "parquet" / "comm" / "run=r").glob("*.parquet")).read_bytes())
    assert catalog.connect(data).execute("SELECT count(*) FROM comm").fetchone() == (7,)


def test_straggler_views_name_the_rank_that_arrived_late(tmp_path):
    data = tmp_path / "data"
    n = 20
    per_rank = {rank: comm_columns(rank, 0, n, delay_ns=5000 if rank == 2 else 0) for rank in range(4)}
    per_rank[1]["start_ns"] = per_rank[1]["start_ns"].copy()
    per_rank[1]["start_ns"][7] += 9000  # instance 7: rank 1 is even later than rank 2 ...
    per_rank[1]["end_ns"] = per_rank[1]["end_ns"].copy()
    per_rank[1]["end_ns"][7] += 9000  # ... and ends no earlier than it started (the collector refuses that)
    store_comm(data, per_rank)
    con = catalog.connect(data)

    worst = con.execute("SELECT seq, last_rank, max_delay_ns, n_ranks, op FROM stragglers ORDER BY seq").fetchall()
    assert len(worst) == n
    for seq, last_rank, delay, n_ranks, op in worst:
        assert n_ranks == 4 and op == "all_reduce"
        assert (last_rank, delay) == ((1, 9000) if seq == 7 else (2, 5000))

    rows = con.execute("""SELECT rank, arrival_delay_ns, wait_ns, is_last FROM comm_instances
                          WHERE seq = 3 ORDER BY rank""").fetchall()
    assert rows == [(0, 0, 5000, False), (1, 0, 5000, False), (2, 5000, 0, True), (3, 0, 5000, False)]
    assert con.execute("SELECT count(*) FROM comm_instances WHERE is_last").fetchone() == (n,)
    blame = con.execute("""SELECT last_rank, count(*) FROM stragglers GROUP BY ALL ORDER BY 2 DESC""").fetchall()
    assert blame == [(2, n - 1), (1, 1)]


@pytest.mark.parametrize(
    "sql, says",
    [
        ("INSERT INTO comm VALUES (1)", "INSERT statement"),
        ("CREATE TABLE t AS SELECT 1", "CREATE statement"),
        ("DROP VIEW comm", "DROP statement"),
        ("COPY (SELECT 1) TO 'x.csv'", "COPY statement"),
        ("ATTACH 'other.duckdb'", "ATTACH statement"),
        ("INSTALL httpfs", "statement"),
        ("SET threads = 1", "SET statement"),
        ("SELECT 1; SELECT 2", "exactly one SQL statement"),
        ("SELECT * FROM read_csv('/etc/passwd')", "Permission Error"),
        ("SELECT * FROM read_parquet('../outside.parquet')", "Permission Error"),
        ("SELEC 1", "syntax error"),
        ("SELECT nope FROM comm", "nope"),
    ],
)
def test_sql_refuses_anything_but_reading_the_catalog(tmp_path, sql, says):
    data = tmp_path / "data"
    catalog.ensure_catalog(data)
    with pytest.raises(catalog.QueryError) as info:
        catalog.run_readonly_query(data, sql)
    assert says in str(info.value)
    out, err = io.StringIO(), io.StringIO()
    assert sqlcli.run(data, sql, out=out, err=err) == 1
    assert err.getvalue().startswith("rankscope sql: ") and "Traceback" not in err.getvalue()
    assert out.getvalue() == ""


def test_sql_prints_an_aligned_table(tmp_path):
    data = tmp_path / "data"
    store_comm(data, {0: comm_columns(0, 0, 3), 10: comm_columns(10, 0, 2)})
    out = io.StringIO()
    assert (
        sqlcli.run(
            data, "SELECT rank, op, count(*) AS n, sum(bytes) AS total FROM comm GROUP BY ALL ORDER BY rank", out=out
        )
        == 0
    )
    lines = out.getvalue().splitlines()
    assert lines[0] == "rank | op         | n | total"
    assert lines[1] == "-----+------------+---+------"
    assert lines[2:] == ["   0 | all_reduce | 3 |  3072", "  10 | all_reduce | 2 |  2048", "(2 rows)"]
    assert len({line.index("|") for line in lines[:1] + lines[2:4]}) == 1


def test_sql_caps_the_rows_it_prints(tmp_path):
    data = tmp_path / "data"
    catalog.ensure_catalog(data)
    out = io.StringIO()
    assert sqlcli.run(data, f"SELECT range AS i FROM range({sqlcli.MAX_ROWS + 5})", out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 + sqlcli.MAX_ROWS + 1 and "add a LIMIT" in lines[-1]
    assert catalog.run_readonly_query(data, "SELECT * FROM range(100)", max_rows=7).num_rows == 7


def test_sql_on_a_missing_data_dir_says_so(tmp_path):
    err = io.StringIO()
    assert sqlcli.run(tmp_path / "nope", "SELECT 1", err=err) == 1
    assert "does not exist" in err.getvalue()
