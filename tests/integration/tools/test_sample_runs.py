"""The shipped sample_runs/ data dir, as committed (`make sample-runs` regenerates it;
these tests only read it): it opens through collector.data.catalog.connect from any cwd
and from a copy elsewhere, holds nothing a reader does not need, and each scenario
run of trainer.examples.scenarios shows what it was made to show. Assertions are on
properties of the runs, not exact numbers, so they hold after any regeneration.

Split by tier: the pure-function tests are in tests/unit/tools/test_sample_runs.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from collector.data import catalog, layout
from tests.unit.tools import test_sample_runs as unit_tier
from tests.unit.tools.test_sample_runs import SAMPLE_RUNS

pytestmark = pytest.mark.skipif(
    not (SAMPLE_RUNS / layout.CATALOG_FILE).exists(), reason="sample_runs/ not generated (make sample-runs)"
)
copied, q = unit_tier.copied, unit_tier.q  # the unit tier's fixtures, shared


DASHBOARD = Path(__file__).resolve().parents[3] / "app"


@pytest.mark.parametrize("page", sorted(p.name for p in (DASHBOARD / "views").glob("*.py")))
def test_every_dashboard_page_renders_every_sample_run(page, copied, q, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("RANKSCOPE_DATA_DIR", str(copied))
    for name, run in q("SELECT name, run_id FROM runs ORDER BY name"):
        at = AppTest.from_file(str(DASHBOARD / "main.py"), default_timeout=60)
        at.session_state["selected_runs"] = [run]
        at.run()
        at.switch_page(f"views/{page}").run()
        assert not at.exception, (name, [e.value for e in at.exception])
        if page == "stragglers.py" and name == "zero2-slow-rank3":
            assert "rank 3 arrives last" in "\n".join(str(m.value) for m in at.markdown)


def test_the_committed_catalog_holds_todays_views(tmp_path):
    """A change to a view's SQL (collector/data/views.py) must be committed with the refreshed
    sample_runs/catalog.duckdb (one `catalog.connect('sample_runs')`, or `make sample-runs`):
    otherwise the first test that opens the committed catalog rewrites it, and a clean clone's
    tree is dirty after make test. Read from git's HEAD: another test may have refreshed the
    working copy already."""
    blob = subprocess.run(
        ["git", "-C", str(SAMPLE_RUNS), "show", f"HEAD:sample_runs/{layout.CATALOG_FILE}"], capture_output=True
    )
    if blob.returncode != 0:
        pytest.skip("not a git checkout")
    committed = tmp_path / layout.CATALOG_FILE
    committed.write_bytes(blob.stdout)
    installed = catalog._installed_version(committed)
    assert installed == catalog._catalog_version(), "sample_runs/catalog.duckdb is stale: open it once and commit it"
