"""Write attempts against the SQL guard (``rankscope sql`` and the dashboard's console):
every statement that could write, load, attach or reconfigure, bare and wrapped in every
form that could smuggle it past a statement-type check. The defence is the connection's
configuration, so each must be refused AND leave the data dir (hashed), the cwd, the
temp dir and the home dir exactly as they were."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from collector.data import catalog, queries
from collector.tools import sql as sql_tool

SAMPLE = Path(__file__).resolve().parents[3] / "sample_runs"


def _bases(data: Path, outside: Path) -> list[str]:
    segment = next((data / "parquet" / "comm").glob("run=*/*.parquet"))
    partition = segment.parent
    targets = [segment, partition / "injected.parquet", outside / "out.csv", "rel-out.csv", "~/home-out.csv"]
    bases = []
    for target in targets:
        bases.append(f"COPY (SELECT * FROM comm LIMIT 1) TO '{target}' (FORMAT parquet)")
        bases.append(f"COPY (SELECT 'x' AS a) TO '{target}' (FORMAT csv)")
    bases += [
        f"COPY comm TO '{data / 'parquet' / 'comm'}' (FORMAT parquet, PARTITION_BY (run_id), OVERWRITE)",
        f"EXPORT DATABASE '{outside / 'export'}'",
        f"ATTACH '{outside / 'attached.duckdb'}' AS x",
        f"ATTACH '{data / 'catalog.duckdb'}' AS cat",
        "INSTALL httpfs",
        f"INSTALL '{outside / 'evil.duckdb_extension'}'",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET allowed_directories = ['/']",
        f"SET temp_directory = '{outside / 'spill'}'",
        "RESET lock_configuration",
        f"PRAGMA profiling_output = '{outside / 'profile.json'}'",
        "CREATE TABLE t AS SELECT 1 AS a",
        "CREATE OR REPLACE VIEW comm AS SELECT 1 AS a",
        f"CREATE SECRET s (TYPE s3, KEY_ID 'k', SECRET 's', SCOPE '{outside}')",
        "INSERT INTO comm SELECT * FROM comm",
    ]
    return bases


WRAPPERS = [
    "{}",
    "EXPLAIN {}",
    "EXPLAIN ANALYZE {}",
    "explain   analyze\n\t{}",
    "PREPARE p AS {}",
    "/* a comment */ {} -- trailing",
    "\n\n   {}   ;  ",
    "SELECT * FROM query('{q}')",
    "CALL query('{q}')",
]


def _corpus(data: Path, outside: Path) -> list[str]:
    out = []
    for base in _bases(data, outside):
        for wrapper in WRAPPERS:
            out.append(wrapper.format(base, q=base.replace("'", "''")))
        out.append(base.lower())
        out.append(f"PREPARE p AS {base}; EXECUTE p")
    return out


def _tree_hash(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def world(tmp_path, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(SAMPLE, data)
    outside = tmp_path / "tmp"
    cwd = tmp_path / "cwd"
    home = tmp_path / "home"
    for d in (outside, cwd, home):
        d.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(outside))
    return data, outside, cwd, home


def test_every_write_attempt_is_refused_and_changes_no_file(world):
    data, outside, cwd, home = world
    corpus = _corpus(data, outside)
    assert len(corpus) >= 200
    watched = [data, outside, cwd, home]
    before = [_tree_hash(d) for d in watched]
    for statement in corpus:
        err = io.StringIO()
        assert sql_tool.run(data, statement, out=io.StringIO(), err=err) == 1, statement
        assert err.getvalue().startswith("rankscope sql: ") and len(err.getvalue()) > 20, statement
        with pytest.raises(catalog.QueryError) as info:
            queries.console_query(str(data), statement, max_rows=100)
        assert str(info.value), statement
    assert [_tree_hash(d) for d in watched] == before
    # and the guard still reads the data it protected
    assert catalog.run_readonly_query(data, "SELECT count(*) AS n FROM comm")["n"][0].as_py() > 0


@pytest.mark.parametrize(
    "statement",
    [
        "EXPLAIN ANALYZE COPY (SELECT 'x') TO '{data}/parquet/comm/x.parquet' (FORMAT csv)",
        "COPY comm TO '{data}/parquet/comm' (FORMAT parquet, PARTITION_BY (run_id), OVERWRITE)",
    ],
)
def test_the_cli_refuses_the_attacks_that_used_to_write(world, statement):
    data, *_ = world
    before = _tree_hash(data)
    proc = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "sql", "--data-dir", str(data), statement.format(data=data)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    assert proc.returncode == 1 and proc.stderr.startswith("rankscope sql: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert _tree_hash(data) == before


def test_the_connection_itself_refuses_writes_without_the_statement_check(world):
    # The statement-type check is only the friendly message: the guard's connection, given the
    # statements directly, must refuse every one on its own.
    data, outside, cwd, home = world
    watched = [data, outside, cwd, home]
    before = [_tree_hash(d) for d in watched]
    for base in _bases(data, outside):
        for statement in (base, f"EXPLAIN ANALYZE {base}"):
            con = catalog.readonly_connection(data)
            try:
                with pytest.raises(duckdb.Error):
                    con.execute(statement)
                    # a statement that "succeeded" must at least have left everything as it was
                    assert [_tree_hash(d) for d in watched] == before, statement
                    assert con.execute("SELECT count(*) FROM comm").fetchone()[0] > 0
                    raise duckdb.Error(f"(harmless) {statement}")
            finally:
                con.close()
    assert [_tree_hash(d) for d in watched] == before
