"""Helpers for the import / replay / export / watch tests (and the live ones that read the same
catalog): the DeepSpeed fixture, the CLI run in-process, and catalog queries."""

from __future__ import annotations

import shutil
from pathlib import Path

from collector.data import catalog, queries
from collector.tools.cli import main as cli_main

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "deepspeed_run"


def copy_fixture(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest)
    return dest


def rankscope(*args) -> int:
    """Run the CLI in-process (what `rankscope ...` runs)."""
    return cli_main([str(a) for a in args])


def query(data_dir, sql: str, params=()) -> list[tuple]:
    """Rows of ``sql``; again if a live collector's compaction unlinked a segment under it."""
    con = catalog.connect(data_dir)
    try:
        return catalog.with_segment_retry(lambda: con.execute(sql, list(params)).fetchall())
    finally:
        con.close()


def only_run(data_dir, source: str | None = None) -> str:
    rows = query(data_dir, "SELECT run_id FROM runs WHERE ? IS NULL OR source = ?", [source, source])
    assert len(rows) == 1, rows
    return rows[0][0]


def on_the_run(data_dir, fn, *args):
    """fn(cat, run_id, *args) on the data dir's only run; None before the run exists."""
    try:
        cat = queries.Catalog(data_dir)
    except queries.DataDirError:
        return None
    try:
        runs = queries.list_runs(cat)
        if runs.empty:
            return None
        return fn(cat, runs.run_id.iloc[0], *args)
    finally:
        cat.close()
