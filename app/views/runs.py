"""Runs: every run in the data dir, live or archived; pick one, or two to compare."""

import json
from functools import partial

import pandas as pd
import streamlit as st

from app import queries, state, tables

TABLE_KEY = "runs_table"


def _pick(run_ids: list[str]) -> None:
    # A callback, so it runs before the sidebar picker is drawn and may set its value.
    rows = st.session_state[TABLE_KEY].selection.rows
    if rows:
        state.select_runs([run_ids[i] for i in rows])


def _comparison(sel: state.Selection) -> pd.DataFrame:
    """Headline numbers of each selected run, one column per run."""
    columns = {}
    for run_id in sel.run_ids:
        version = queries.data_version(sel.data_dir, run_id)
        run = sel.run(run_id)
        wall = queries.step_wall_ms(sel.data_dir, run_id, version)
        scales = queries.loss_scale(sel.data_dir, run_id, version)
        summary = queries.log_summary(sel.data_dir, run_id, version, queries.CommFilter())
        row = {
            "status": run.status,
            "world size": int(run.world_size),
            "steps timed": int(wall.steps.max()) if not wall.empty else 0,
            "mean step (ms)": round(wall.wall_ms.sum() / wall.steps.sum(), 1) if not wall.empty else None,
            "loss-scale overflows": int(scales.overflow.sum()) if not scales.empty else 0,
        }
        for op, rows in summary.groupby("op"):
            row[f"{op} busbw (GB/s)"] = round((rows.busbw_gbs * rows["count"]).sum() / rows["count"].sum(), 3)
        columns[f"{run['name']} ({run_id})"] = row
    return pd.DataFrame(columns)


def runs_page() -> None:
    sel = state.selection()
    runs = sel.runs
    st.caption(
        "Select rows to pick runs for every page (two at most: the first is the primary one). "
        "Runs of the same name differ by their run id and start time."
    )
    shown = runs[
        ["name", "run_id", "status", "world_size", "n_ranks", "started_at", "ended_at", "duration_s", "source"]
    ]
    # the table's ticks follow the picked runs (the sidebar's, a link's ?run=), not only its own clicks
    picked = [runs.run_id.tolist().index(r) for r in sel.run_ids if r in set(runs.run_id)]
    current = st.session_state.get(TABLE_KEY)
    if current is None or sorted(current.get("selection", {}).get("rows", [])) != sorted(picked):
        st.session_state[TABLE_KEY] = {"selection": {"rows": picked, "columns": [], "cells": []}}
    tables.dataframe(
        shown,
        hide_index=True,
        on_select=partial(_pick, runs.run_id.tolist()),
        selection_mode="multi-row",
        key=TABLE_KEY,
        column_config={
            "duration_s": st.column_config.NumberColumn("duration (s)", format="%.0f"),
            "started_at": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm:ss"),
            "ended_at": st.column_config.DatetimeColumn("ended", format="YYYY-MM-DD HH:mm:ss"),
        },
    )

    st.subheader("Selected")
    if len(sel.run_ids) > 1:
        st.dataframe(_comparison(sel).astype(str))
    for run_id in sel.run_ids:
        run = sel.run(run_id)
        started = pd.Timestamp(run.started_at).strftime("%Y-%m-%d %H:%M:%S") if pd.notna(run.started_at) else "?"
        with st.expander(f"Config of {run['name']} ({run_id}, started {started})", expanded=len(sel.run_ids) == 1):
            try:  # the top level shown, its sections one click away: a ZeRO config is a long page
                st.json(json.loads(run.config) if run.config else {}, expanded=1)
            except json.JSONDecodeError:
                st.error("This run's config is not valid JSON; showing it as sent.")
                st.code(run.config)


st.title("Runs")
runs_page()
