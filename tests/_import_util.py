"""Helpers for the import / replay / export / watch tests: the DeepSpeed fixture,
a live collector on a real port, and catalog queries."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from collector import catalog
from collector.cli import main as cli_main
from collector.server import create_server
from collector.store import StoreConfig

FIXTURE = Path(__file__).parent / "fixtures" / "deepspeed_run"


def copy_fixture(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest)
    return dest


def rankscope(*args) -> int:
    """Run the CLI in-process (what `rankscope ...` runs)."""
    return cli_main([str(a) for a in args])


def query(data_dir, sql: str, params=()) -> list[tuple]:
    con = catalog.connect(data_dir)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def only_run(data_dir, source: str | None = None) -> str:
    rows = query(data_dir, "SELECT run_id FROM runs WHERE ? IS NULL OR source = ?", [source, source])
    assert len(rows) == 1, rows
    return rows[0][0]


@contextlib.contextmanager
def live_collector(data_dir, port: int):
    """A real collector on 127.0.0.1:port over data_dir; yields its endpoint."""
    server, bound, state = create_server(f"127.0.0.1:{port}", data_dir,
                                         store_config=StoreConfig(flush_interval=0.05))
    server.start()
    try:
        yield f"127.0.0.1:{bound}"
    finally:
        server.stop(grace=2).wait()
        state.close()
