"""Every dashboard page, run by Streamlit's AppTest against a real catalog over two
fake runs (collector.testing.fake_runs: rank 3 late to every all_reduce, known overflows)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from collector.testing.fake_runs import COLLECTIVES, FINISHED, FLOPS_TREE, LIVE, write_data_dir
from tests.integration.app import _pages
from tests.integration.app._pages import MAIN

TIMEOUT = 60
DELAYED_RANK, OVERFLOW_STEPS = FINISHED.late_rank, FINISHED.overflow_steps


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_data_dir(tmp_path_factory.mktemp("app-data"), FINISHED, LIVE)


@pytest.fixture
def open_page(data_dir, monkeypatch):
    """open_page("views/x.py", run_ids) -> the AppTest after rendering that page."""

    def _open(page: str | None, run_ids: list[str] | None = None) -> AppTest:
        return _pages.open_page(data_dir, monkeypatch, page, run_ids, timeout=TIMEOUT)

    return _open


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def labelled(widgets, label: str):
    return next(w for w in widgets if w.label == label)


def frames(at: AppTest):
    return [df.value for df in at.dataframe]


def test_runs_page_lists_every_run_and_compares_two(open_page):
    at = open_page(None, [FINISHED.run_id, LIVE.run_id])
    listed = frames(at)[0]
    assert set(listed.run_id) == {FINISHED.run_id, LIVE.run_id}
    assert dict(zip(listed.run_id, listed.status)) == {FINISHED.run_id: "finished", LIVE.run_id: "running"}
    comparison = frames(at)[1]
    assert list(comparison.columns) == [f"{FINISHED.name} ({FINISHED.run_id})", f"{LIVE.name} ({LIVE.run_id})"]
    assert comparison.loc["loss-scale overflows"].tolist() == [
        str(len(OVERFLOW_STEPS)),
        str(sum(s < LIVE.steps for s in OVERFLOW_STEPS)),
    ]


def test_selection_from_query_param(data_dir, monkeypatch):
    monkeypatch.setenv("RANKSCOPE_DATA_DIR", str(data_dir))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.query_params["run"] = LIVE.run_id
    at.run()
    assert not at.exception
    assert at.session_state["selected_runs"] == [LIVE.run_id]


def test_overview_health_names_the_straggler_and_the_overflows(open_page):
    at = open_page("views/overview.py", [FINISHED.run_id])
    warnings = texts(at.warning)
    assert f"rank {DELAYED_RANK} costs" in warnings and "by arriving late at all_reduce" in warnings
    assert f"loss scale fell {len(OVERFLOW_STEPS)} times in {FINISHED.steps} steps" in warnings
    assert "communication is in flight" in texts(at.info)
    # loss, lr, loss scale, samples/s, step breakdown, straggler cost over steps
    assert len(at.get("plotly_chart")) >= 6


def test_overview_of_a_live_run_refreshes_in_a_fragment(open_page):
    at = open_page("views/overview.py", [LIVE.run_id])
    assert any("Live: refreshing" in c.value for c in at.caption)


def test_comms_summary_lists_each_op_with_bandwidth(open_page):
    at = open_page("views/comms.py", [FINISHED.run_id])
    summary = at.table[0].value
    assert set(summary["Comm. Op"]) == {op for op, _, _ in COLLECTIVES}
    assert (summary["busbw_avg (Gbps)"] > 0).all()
    # Count adds up every rank's records: instances x world size.
    per_op = summary.groupby("Comm. Op").Count.sum()
    expected = {
        op: sum(o == op for o, _, _ in COLLECTIVES) * FINISHED.steps * FINISHED.world_size for op, _, _ in COLLECTIVES
    }
    assert per_op.to_dict() == expected
    assert len(at.get("plotly_chart")) == 2


def test_comms_filters_narrow_the_summary(open_page):
    at = open_page("views/comms.py", [FINISHED.run_id])
    labelled(at.multiselect, "Op").set_value(["all_gather"]).run()
    labelled(at.multiselect, "Rank").set_value([DELAYED_RANK]).run()
    assert not at.exception
    summary = at.table[0].value
    assert set(summary["Comm. Op"]) == {"all_gather"}
    assert summary.Count.sum() == sum(o == "all_gather" for o, _, _ in COLLECTIVES) * FINISHED.steps


def test_comms_compares_two_runs_per_op(open_page):
    at = open_page("views/comms.py", [FINISHED.run_id, LIVE.run_id])
    table = frames(at)[-1]
    assert set(table.index) == {op for op, _, _ in COLLECTIVES}
    assert {run for _, run in table.columns} == {f"{FINISHED.name} ({FINISHED.run_id})", f"{LIVE.name} ({LIVE.run_id})"}


def test_stragglers_page_names_the_delayed_rank_and_drills_down(open_page):
    at = open_page("views/stragglers.py", [FINISHED.run_id])
    assert f"**all_reduce**: rank {DELAYED_RANK} arrives last in 100%" in texts(at.markdown)
    assert len(at.get("plotly_chart")) == 3  # last-rank bars, delay heatmap, wait heatmap
    by_host = next(df for df in frames(at) if "host" in df.columns)
    assert set(by_host.host) == {"node-a", "node-b"}
    labelled(at.selectbox, "Rank").set_value(0)
    labelled(at.number_input, "Step").set_value(7).run()
    instances = frames(at)[-1]
    reduces = instances[instances.op == "all_reduce"]
    assert len(reduces) == sum(o == "all_reduce" for o, _, _ in COLLECTIVES)
    assert (reduces.last_rank == DELAYED_RANK).all()
    assert (reduces.wait_ms > 30).all()  # rank 0 waits ~40 ms for rank 3


def test_flops_page_shows_the_module_tree_and_table(open_page):
    at = open_page("views/flops.py", [FINISHED.run_id])
    table = next(df for df in frames(at) if "% params" in df.columns)
    assert len(table) == len(FLOPS_TREE)
    assert table.loc[table.module == "(model)", "% params"].item() == 100
    for kind in ("treemap", "sunburst"):
        labelled(at.radio, "Chart").set_value(kind).run()
        assert not at.exception
    assert at.get("plotly_chart")


def test_memory_and_moe_pages(open_page):
    at = open_page("views/memory.py", [FINISHED.run_id])
    assert len(at.get("plotly_chart")) == 5  # one per kind
    at = open_page("views/moe.py", [FINISHED.run_id])
    assert len(at.get("plotly_chart")) == 2
    assert len(frames(at)[0]) == 8  # experts


def test_moe_page_empty_state_offers_the_run_that_has_moe_records_one_click_away(open_page):
    at = open_page("views/moe.py", [LIVE.run_id])
    assert "No MoE records" in texts(at.info)
    (switch,) = [b for b in at.button if FINISHED.run_id in b.label]
    switch.click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["selected_runs"] == [FINISHED.run_id]
    assert len(at.get("plotly_chart")) == 2 and "No MoE records" not in texts(at.info)


def test_pipeline_page_draws_a_step_and_the_bubbles(open_page):
    at = open_page("views/pipeline.py", [FINISHED.run_id])
    assert len(at.get("plotly_chart")) == 2  # the step's timeline, bubble fraction per stage over steps
    table = frames(at)[0]
    assert list(table.stage) == [0, 1]  # the fake run: a balanced 2-stage pipeline, 8 micro-batches
    # 1F1B's ideal (equal stages, no overhead), as the table shows it: 3 decimals (app.tables)
    assert (table.bubble_fraction == round(1 / 9, 3)).all()
    at.select_slider[0].set_value(3).run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) == 2


def _console(open_page, sql: str) -> AppTest:
    at = open_page("views/sql.py")
    at.text_area[0].set_value(sql)
    at.button[0].click().run()
    assert not at.exception
    return at


def test_sql_console_runs_a_query(open_page):
    at = _console(open_page, "SELECT op, count(*) AS n FROM comm WHERE run_id = 'run-a1' GROUP BY op ORDER BY op")
    result = frames(at)[0]
    assert set(result.op) == {op for op, _, _ in COLLECTIVES}
    assert not at.error
    assert len(at.get("download_button")) == 2  # CSV and Parquet
    assert len(at.get("plotly_chart")) == 1  # the chart builder's default: n by op


def test_sql_console_shows_duckdb_error_for_bad_sql(open_page):
    at = _console(open_page, "SELECT no_such_column FROM comm")
    assert 'Referenced column "no_such_column" not found' in texts(at.error)


@pytest.mark.parametrize(
    "sql",
    [
        "DROP VIEW comm",
        "COPY comm TO '/tmp/x.csv'",
        "ATTACH '/tmp/x.db'",
        "INSTALL httpfs",
        "SELECT * FROM read_csv('/etc/passwd')",
    ],
)
def test_sql_console_refuses_writes_and_outside_files(open_page, sql):
    at = _console(open_page, sql)
    assert at.error, sql
    assert not frames(at)


@pytest.mark.parametrize(
    "env, sql, says",
    [
        (
            ("RANKSCOPE_SQL_MEMORY_LIMIT", "128MiB"),  # ~1 GB of strings in one list
            "SELECT count(*) FROM (SELECT unnest(list(repeat('x', 1000))) AS x FROM range(1000000))",
            "it needed more than the 128 MiB memory limit (--sql-memory-limit",
        ),
        (
            ("RANKSCOPE_SQL_TIME_LIMIT", "0.5"),  # never ends by itself
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
            "query stopped after 0.5 s (the time limit: --sql-time-limit",
        ),
    ],
)
def test_sql_console_stops_a_query_at_its_limit_and_says_which(open_page, monkeypatch, env, sql, says):
    monkeypatch.setenv(*env)  # what `rankscope dashboard --sql-memory-limit / --sql-time-limit` sets
    at = _console(open_page, sql)
    assert says in texts(at.error), texts(at.error)
    assert not frames(at)
    assert "per query" in texts(at.caption)


def test_missing_data_dir_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RANKSCOPE_DATA_DIR", str(tmp_path / "nope"))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert "does not exist" in texts(at.error)


def test_empty_data_dir_says_how_to_get_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RANKSCOPE_DATA_DIR", str(tmp_path))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert "No runs" in texts(at.info)


def test_damaged_segment_is_left_out_with_a_warning_naming_it_not_a_traceback(tmp_path, monkeypatch):
    data_dir = write_data_dir(tmp_path, FINISHED)
    damaged = data_dir / "parquet" / "comm" / f"run={FINISHED.run_id}" / "zz-damaged.parquet"
    damaged.write_bytes(b"not parquet")
    monkeypatch.setenv("RANKSCOPE_DATA_DIR", str(data_dir))
    for page in ("views/comms.py", "views/stragglers.py", "views/overview.py"):
        at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
        at.session_state["selected_runs"] = [FINISHED.run_id]
        at.run()
        at.switch_page(page).run()
        assert not at.exception, page
        assert str(damaged.resolve()) in texts(at.warning), page
