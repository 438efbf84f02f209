"""Captured evidence on the pages: the profile diffs of a run (the collector asks a suspect and a
reference rank to profile a few steps, collector/server/escalation.py; collector/data/trace_diff.py
diffs them), each shown under what it explains with both traces to download."""

from __future__ import annotations

import streamlit as st

from app import queries


def captured(data_dir: str, run_id: str) -> list[dict]:
    """The run's diffs, newest first; read again only when its ``artifacts`` change."""
    return queries.evidence(data_dir, run_id, queries.table_version(data_dir, run_id, ("artifacts",)))


def show(data_dir: str, found: dict) -> None:
    """One diff: its headline, and the suspect's and reference's traces merged, to download."""
    if "error" in found:
        st.caption(f"Evidence: {found['error']}")
        return
    first, last = found["steps"]
    st.caption(f"Evidence (profiled steps {first}-{last}): {found['headline']}")
    roles = {found["suspect"]: "suspect", found["reference"]: "reference"}
    traces = tuple((rank, roles[rank], path) for rank, path in sorted(found["traces"].items()))
    st.download_button(
        "Download both traces (Perfetto JSON)",
        data=queries.merged_trace(data_dir, traces),
        file_name=f"{found['request_id']}-merged.json",
        mime="application/json",
        key=f"evidence-{found['request_id']}-{found['suspect']}",
    )
