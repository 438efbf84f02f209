"""A dashboard page as Streamlit's AppTest renders it (the app runs in this process) over a data dir."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

MAIN = str(Path(__file__).resolve().parents[3] / "app" / "main.py")


def open_page(
    data_dir, monkeypatch, page: str | None, run_ids: list[str] | None = None, timeout: float = 60
) -> AppTest:
    """The AppTest after the app's first run with ``run_ids`` selected and then ``page`` (a path under
    app/, e.g. "views/comms.py"; None stays on the start page); fails on any exception it shows."""
    monkeypatch.setenv("RANKSCOPE_DATA_DIR", str(data_dir))
    at = AppTest.from_file(MAIN, default_timeout=timeout)
    if run_ids is not None:
        at.session_state["selected_runs"] = run_ids
    at.run()
    if page is not None:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at
