"""Helpers for the import / replay / export / watch tests: the DeepSpeed fixture, the CLI
run in-process, and catalog queries."""

from __future__ import annotations

import shutil
from pathlib import Path

from collector.data import catalog
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
