"""Rank-side telemetry session (work in progress: the full session lands next)."""
from __future__ import annotations

from collector.schema import TABLES

_step = 0
_session = None


def session():
    return _session


def set_step(step: int) -> None:
    global _step
    _step = int(step)


def get_step() -> int:
    return _step


def comm_columns() -> list[str]:
    return [name for name, _ in TABLES["comm"].columns]


def emit(table: str, **row) -> None:
    pass


def emit_rows(table: str, rows) -> None:
    pass


def emit_columns(table: str, columns: dict, n: int) -> None:
    pass


def on_process_group() -> None:
    pass
