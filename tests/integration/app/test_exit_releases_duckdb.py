"""A process that ran the dashboard (Streamlit's AppTest: the app in this process, as the page tests run
it) exits without DuckDB's bindings printing "nanobind: leaked 29 instances!" (the connection, DuckDB's
type objects) after its last line. The app's cached catalog (app/queries.catalog, a Streamlit resource)
outlived the interpreter's teardown in a process that had also imported torch (an xdist worker after a
rank test, the timing phase of `make test`), and its DuckDB connection with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SAMPLE_RUNS = ROOT / "sample_runs"
RUN = "zero2-slow-rank3-20261124-035353-5d6129"

SCRIPT = f"""
import os
import torch  # noqa: F401  (what the process had loaded when the dump was printed)
from streamlit.testing.v1 import AppTest

os.environ["RANKSCOPE_DATA_DIR"] = {str(SAMPLE_RUNS)!r}
at = AppTest.from_file({str(ROOT / "app" / "main.py")!r}, default_timeout=120)
at.session_state["selected_runs"] = [{RUN!r}]
at.run()
at.switch_page("views/overview.py").run()
assert not at.exception, [e.value for e in at.exception]
print("rendered", flush=True)
"""


def test_a_process_that_ran_the_dashboard_leaves_no_duckdb_connection_at_exit(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0 and "rendered" in out.stdout, out.stdout + out.stderr[-4000:]
    leaked = [line for line in out.stderr.splitlines() if line.startswith("nanobind:")]
    assert leaked == [], "\n".join(leaked + [line for line in out.stderr.splitlines() if "leaked instance" in line][:3])
