"""?run= takes a run name as the CLI does (queries.pick_run): a name one run has opens it; a name
several runs share opens none of them silently, but asks which, in the sidebar."""

from __future__ import annotations

from datetime import timedelta

import pytest
from streamlit.testing.v1 import AppTest

from collector.testing.fake_runs import FakeRun, write_data_dir
from collector.testing.fake_runs.story import START
from tests.integration.app._pages import MAIN

TIMEOUT = 60
ONLY = FakeRun(run_id="only-1", name="only", steps=5, with_moe=False, with_pipe=False)
TWINS = [
    FakeRun(
        run_id=f"twin-{i}", name="twin", steps=5, start=START + timedelta(minutes=i), with_moe=False, with_pipe=False
    )
    for i in (1, 2)
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_data_dir(tmp_path_factory.mktemp("names"), ONLY, *TWINS)


def _open(data_dir, monkeypatch, run: str) -> AppTest:
    monkeypatch.setenv("RANKSCOPE_DATA_DIR", str(data_dir))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.query_params["run"] = run
    at.run()
    assert not at.exception, at.exception
    return at


def test_a_name_one_run_has_opens_it(data_dir, monkeypatch):
    assert _open(data_dir, monkeypatch, "only").session_state["selected_runs"] == ["only-1"]


def test_a_shared_name_asks_which_run(data_dir, monkeypatch):
    at = _open(data_dir, monkeypatch, "twin")
    assert at.session_state["selected_runs"] == [], "a shared name must not open one of its runs silently"
    picker = [r for r in at.sidebar.radio if "?run=twin" in r.label]
    assert picker, f"no picker for the ambiguous name: {[r.label for r in at.sidebar.radio]}"
    assert list(picker[0].options) and len(picker[0].options) == 2
    picker[0].set_value("twin-1").run()
    assert not at.exception, at.exception
    assert at.session_state["selected_runs"] == ["twin-1"]
