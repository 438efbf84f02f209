"""The Comms page (and the Overview) on a run with a slow host link (rankscope simulate --slow-link, written through
the real Store): the busbw-vs-size chart draws the expected band and marks what fell under it, and
the page says which link; on a healthy run over hosts it draws the band and warns of nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from collector.tools import simulate
from tests.integration.app._pages import open_page


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("links-app")
    shape = dict(ranks=32, hosts=4, steps=40)
    simulate.write_data_dir(
        simulate.Simulation(run_id="slow", slow_links=(simulate.SlowLink(2, 4.0, 20, 32),), **shape), d
    )
    simulate.write_data_dir(simulate.Simulation(run_id="calm", host_groups=True, **shape), d)
    return d


def comms(data_dir, monkeypatch, run_id: str) -> AppTest:
    return open_page(data_dir, monkeypatch, "views/comms.py", [run_id])


def trace_names(at: AppTest) -> list[str]:
    names = []
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        names += [t.get("name", "") for t in spec["data"]]
    return names


def test_a_slow_link_is_marked_under_the_expected_band_and_named(data_dir, monkeypatch):
    at = comms(data_dir, monkeypatch, "slow")
    names = trace_names(at)
    assert "all_reduce expected (p10-p90)" in names and "slow link" in names
    assert any("node-0002's link" in w.value for w in at.warning)
    [health] = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if "Link health" in c.proto.spec]
    assert health["data"][0]["y"][0] == "node-0002"  # the slow host's row on top


def test_a_healthy_run_over_hosts_gets_the_band_and_no_mark(data_dir, monkeypatch):
    at = comms(data_dir, monkeypatch, "calm")
    names = trace_names(at)
    assert "all_reduce expected (p10-p90)" in names and "slow link" not in names
    assert not [w for w in at.warning if "Slow link" in w.value]


def test_the_overview_names_the_slow_link(data_dir, monkeypatch):
    at = open_page(data_dir, monkeypatch, "views/overview.py", ["slow"])
    assert "node-0002's link" in "\n".join(str(w.value) for w in at.warning)
