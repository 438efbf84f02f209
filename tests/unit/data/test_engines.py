"""Other engines read the Parquet tree of a data dir as it is: ClickHouse (chdb) here and Spark
(pyspark, local mode) in the slow test count the same rows per (table, run) as DuckDB and sum
the same bytes and timestamps. The data dir is a copy of sample_runs/ (its collector tables
turned back into the nanosecond timestamps every data dir held before they were microseconds)
plus a simulated run the collector's Store writes today; the collector's compaction then folds
the old and new segments of those tables together, as it does in a data dir written before."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collector.data import catalog, layout
from collector.data.schema import LEGACY_TIMESTAMP, TIMESTAMP, reading_schema
from collector.server.compaction import Compactor
from collector.server.ledger import Ledger
from collector.tools import simulate

SAMPLE_RUNS = Path(__file__).resolve().parents[3] / "sample_runs"
# (table, column) summed per run besides the counts: bytes moved, and the wall clock in µs
AGGREGATES = {"comm": "bytes", "runs": "started_at", "ranks": "started_at", "rank_ends": "ended_at"}

pytestmark = pytest.mark.skipif(
    not (SAMPLE_RUNS / layout.CATALOG_FILE).exists(), reason="sample_runs/ not generated (make sample-runs)"
)


def _legacy(data_dir: Path) -> int:
    """Rewrite the collector tables' segments with nanosecond timestamps, as written before; returns how many."""
    n = 0
    for table, schema in layout.COLLECTOR_TABLES.items():
        for part in layout.partitions(data_dir, table):
            for path in part.glob(f"*{layout.SEGMENT_SUFFIX}"):
                old = pq.read_table(path)  # a column added since (rank_ends.ended_by) is not in it
                pq.write_table(old.cast(pa.schema([reading_schema(schema).field(c) for c in old.column_names])), path)
                n += 1
    return n


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("engines") / "data"
    shutil.copytree(SAMPLE_RUNS, dest)
    assert _legacy(dest) > 0
    simulate.write_data_dir(simulate.Simulation(ranks=8, steps=6, name="engines-sim"), dest)
    Compactor(dest, Ledger(dest)).catch_up()  # folds the old ns segments with the new µs ones
    return dest


def _run_key(table: str) -> str | None:
    """The column naming a row's run: the collector tables hold run_id, the others live under run=<id>."""
    return "run_id" if "run_id" in layout.stored_schemas()[table].names else None


def _duckdb_counts(data_dir: Path) -> dict:
    con = catalog.connect(data_dir)  # a reader of today's catalog; it reads the files as they are
    out = {}
    try:
        for table in layout.stored_schemas():
            glob = str(layout.table_dir(data_dir, table) / "run=*" / f"*{layout.SEGMENT_SUFFIX}")
            key = _run_key(table) or "run"
            agg = AGGREGATES.get(table)
            value = "0" if agg is None else (f"sum({agg})" if agg == "bytes" else f"sum(epoch_us({agg}))")
            rows = con.execute(
                f"SELECT {key}, count(*), {value} FROM read_parquet(?, hive_partitioning = true, "
                "union_by_name = true, hive_types = {'run': VARCHAR}) GROUP BY ALL",
                [glob],
            ).fetchall()
            out.update({(table, run): (n, int(v or 0)) for run, n, v in rows if n})
    finally:
        con.close()
    return out


def _chdb_counts(data_dir: Path) -> dict:
    import chdb

    out = {}
    for table in layout.stored_schemas():
        glob = str(layout.table_dir(data_dir, table) / "run=*" / f"*{layout.SEGMENT_SUFFIX}")
        key = _run_key(table) or "extract(_path, 'run=([^/]+)/')"
        agg = AGGREGATES.get(table)
        value = "0" if agg is None else (f"sum({agg})" if agg == "bytes" else f"sum(toUnixTimestamp64Micro({agg}))")
        csv = chdb.query(f"SELECT {key}, count(), {value} FROM file('{glob}', Parquet) GROUP BY 1", "TabSeparated")
        for line in str(csv).splitlines():
            run, n, v = line.split("\t")
            if int(n):
                out[(table, run)] = (int(n), int(float(v)) if v != "\\N" else 0)
    return out


def test_no_nanosecond_timestamp_is_left_after_compaction(data_dir):
    for table in layout.stored_schemas():
        for part in layout.partitions(data_dir, table):
            for path in part.glob(f"*{layout.SEGMENT_SUFFIX}"):
                types = {f.name: f.type for f in pq.read_schema(path)}
                assert LEGACY_TIMESTAMP not in types.values(), f"{path} still holds ns timestamps: {types}"
    assert [f.name for f in layout.COLLECTOR_TABLES["runs"] if f.type == TIMESTAMP] == ["started_at"]


def test_the_legacy_rows_survive_the_fold_with_their_times(data_dir):
    old = catalog.connect(SAMPLE_RUNS)
    new = catalog.connect(data_dir)
    try:
        sql = "SELECT name, epoch_us(started_at), epoch_us(ended_at), status FROM runs ORDER BY name"
        before, after = old.execute(sql).fetchall(), new.execute(sql).fetchall()
    finally:
        old.close()
        new.close()
    assert [r for r in after if r[0] != "engines-sim"] == before
    assert len(after) == len(before) + 1


@pytest.mark.skipif(importlib.util.find_spec("chdb") is None, reason="chdb is not installed (pip install '.[test]')")
def test_clickhouse_counts_and_sums_what_duckdb_does(data_dir):
    duck = _duckdb_counts(data_dir)
    assert any(table == "comm" and run.startswith("engines-sim") for table, run in duck)
    assert _chdb_counts(data_dir) == duck


@pytest.mark.slow
def test_spark_counts_and_sums_what_duckdb_does(data_dir, tmp_path):
    pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]'; it is 450 MB)")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime (17) on PATH")
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.local.dir", str(tmp_path))
        .getOrCreate()
    )
    assert pyspark.__version__
    out = {}
    try:
        for table in layout.stored_schemas():
            frame = spark.read.option("mergeSchema", "true").parquet(str(layout.table_dir(data_dir, table)))
            key = _run_key(table) or "run"
            agg = AGGREGATES.get(table)
            value = F.max(F.lit(0)) if agg is None else F.sum(agg if agg == "bytes" else F.unix_micros(agg))
            for row in frame.groupBy(key).agg(F.count("*").alias("n"), value.alias("v")).collect():
                if row["n"]:
                    out[(table, str(row[key]))] = (row["n"], int(row["v"] or 0))
    finally:
        spark.stop()
    assert out == _duckdb_counts(data_dir)
