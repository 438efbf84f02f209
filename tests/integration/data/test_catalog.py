"""The DuckDB catalog over real segments: views, straggler views, read-only SQL.

Split by tier: the pure-function tests are in tests/unit/data/test_catalog.py."""

from __future__ import annotations

import subprocess
import sys

from collector.data import catalog
from collector.testing.fake_runs import comm_columns
from tests.unit.data.test_catalog import store_comm


def test_views_resolve_paths_against_the_data_dir_from_any_cwd(tmp_path, monkeypatch):
    data = tmp_path / "data"
    store_comm(data, {0: comm_columns(0, 0, 7)})
    monkeypatch.chdir(tmp_path / "data" / "parquet")
    assert catalog.connect(data).execute("SELECT count(*) FROM comm").fetchone() == (7,)
    # another process, another cwd, read-only, while we hold a connection open
    held = catalog.connect(data)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from collector import catalog; "
            "print(catalog.connect(sys.argv[1]).execute('SELECT count(*) FROM comm').fetchone()[0])",
            str(data),
        ],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "7"
    held.close()
