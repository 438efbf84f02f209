"""SQL console: read-only queries over the catalog's views, a quick chart, downloads.

Queries go through collector.data.catalog.run_readonly_query: one SELECT-like
statement in a sandboxed database that can read nothing outside D/parquet."""

import io

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import streamlit as st

from app import charts, queries, state
from collector.data.catalog import QueryError, SqlLimits, format_byte_size

# {run}: the run picked in the sidebar (quoted); "Runs" lists them all
EXAMPLES = {
    "Runs": "SELECT run_id, name, status, world_size, started_at, ended_at FROM runs ORDER BY started_at DESC",
    "Bus bandwidth per op and rank": (
        "SELECT op, rank, count(*) AS n, round(avg(busbw_gbs), 3) AS busbw_gbs\n"
        "FROM comm WHERE run_id = {run} GROUP BY ALL ORDER BY op, rank"
    ),
    "Bus bandwidth per step": (
        "SELECT step, op, round(avg(busbw_gbs), 3) AS busbw_gbs\n"
        "FROM comm WHERE run_id = {run} GROUP BY ALL ORDER BY step, op"
    ),
    "Who arrives last": (
        "SELECT op, last_rank, count(*) AS times_last,\n"
        "       round(median(max_delay_ns) / 1e6, 2) AS median_delay_ms\n"
        "FROM stragglers WHERE run_id = {run} GROUP BY ALL ORDER BY times_last DESC"
    ),
    "Loss-scale overflows": (
        "SELECT step, scale_before, scale, bad_params FROM loss_scale\n"
        "WHERE run_id = {run} AND overflow AND rank = 0 ORDER BY step"
    ),
    "Slowest modules": (
        "SELECT module, module_type, latency_ns / 1e6 AS fwd_ms, flops / latency_ns / 1e3 AS tflops\n"
        "FROM flops WHERE run_id = {run} AND rank = 0 ORDER BY latency_ns DESC LIMIT 20"
    ),
    "Step time per rank": (
        "SELECT rank, name, round(avg(dur_ns) / 1e6, 2) AS mean_ms FROM timers\n"
        "WHERE run_id = {run} GROUP BY ALL ORDER BY rank, name"
    ),
    "Stuck collectives": "SELECT * FROM hangs WHERE run_id = {run}",
}
DEFAULT_EXAMPLE = "Bus bandwidth per op and rank"
SQL_KEY, RESULT_KEY = "sql.text", "sql.result"


def example(name: str, run_id: str | None) -> str:
    """An example's SQL for the picked run (a quoted literal: run ids are ours, but quote anyway)."""
    quoted = "'" + (run_id or "").replace("'", "''") + "'"
    return EXAMPLES[name].replace("{run}", quoted)


def _selected_run() -> str | None:
    chosen = st.session_state.get(state.SELECTION_KEY) or []
    return chosen[0] if chosen else None


def _use_example() -> None:
    st.session_state[SQL_KEY] = example(st.session_state["sql.example"], _selected_run())


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf)
    return buf.getvalue()


def chart_builder(result: pd.DataFrame) -> None:
    numeric = [c for c in result.columns if pd.api.types.is_numeric_dtype(result[c])]
    if not numeric or len(result.columns) < 2:
        return
    kinds, columns = ["line", "bar", "scatter"], list(result.columns)
    kind0, x0, y0, colour0 = charts.custom_defaults(result)
    with st.expander("Chart", expanded=True):
        c1, c2, c3, c4 = st.columns(4)
        kind = c1.selectbox("Kind", kinds, index=kinds.index(kind0))
        x = c2.selectbox("x", columns, index=columns.index(x0))
        y = c3.selectbox("y", numeric, index=numeric.index(y0) if y0 in numeric else len(numeric) - 1)
        colours = [None] + [c for c in columns if c not in (x, y)]
        color = c4.selectbox("Colour", colours, index=colours.index(colour0) if colour0 in colours else 0)
        st.plotly_chart(charts.custom(result, kind, x, y, color))


def _limits_caption() -> str:
    """The limits a query runs under (``rankscope dashboard --sql-memory-limit / --sql-time-limit``)."""
    try:
        limits = SqlLimits.resolve()
    except ValueError:
        return ""  # a bad value in the environment: running a query says which
    memory = format_byte_size(limits.memory_bytes) if limits.memory_bytes else "no memory limit"
    time_s = f"{limits.time_s:g} s" if limits.time_s else "no time limit"
    return f" Limits per query: {memory}, {time_s}."


def sql_page() -> None:
    directory = st.session_state.get("rankscope.data_dir") or state.data_dir()
    st.selectbox(
        "Examples",
        list(EXAMPLES),
        key="sql.example",
        on_change=_use_example,
        index=None,
        placeholder="Pick an example query…",
    )
    run_id = _selected_run()
    if st.session_state.get("sql.default_for") != run_id and st.session_state.get(SQL_KEY) in (
        None,
        example(DEFAULT_EXAMPLE, st.session_state.get("sql.default_for")),
    ):  # the untouched default follows the run picked in the sidebar
        st.session_state[SQL_KEY] = example(DEFAULT_EXAMPLE, run_id)
        st.session_state["sql.default_for"] = run_id
    with st.form("sql"):
        sql = st.text_area(
            "SQL (read-only: one SELECT / WITH / FROM / DESCRIBE / SHOW statement)", key=SQL_KEY, height=140
        )
        max_rows = st.number_input("Max rows", min_value=1, max_value=1_000_000, value=10_000)
        submitted = st.form_submit_button("Run", type="primary")
    views = queries.console_views(directory)
    st.caption(
        f"Views: {', '.join(views)} (columns: `DESCRIBE comm`)."
        + (f" The examples read the run picked in the sidebar, `{run_id}`." if run_id else "")
        + _limits_caption()
    )
    if submitted:
        try:
            st.session_state[RESULT_KEY] = queries.console_query(directory, sql, int(max_rows))
        except QueryError as exc:
            st.session_state.pop(RESULT_KEY, None)
            st.error(f"Query failed: {exc}")
    result = st.session_state.get(RESULT_KEY)
    if result is None:
        return
    st.write(f"{len(result):,} rows")
    st.dataframe(result, hide_index=True)
    c1, c2 = st.columns(2)
    c1.download_button("Download CSV", result.to_csv(index=False).encode(), "query.csv", "text/csv")
    c2.download_button("Download Parquet", _parquet_bytes(result), "query.parquet", "application/octet-stream")
    chart_builder(result)


st.title("SQL console")
sql_page()
