"""Captured evidence on the pages: the profile diffs of a run (the collector asks a suspect and a
reference rank to profile a few steps, collector/server/escalation.py; collector/data/trace_diff.py
diffs them), each shown under what it explains with both traces to download; and, for a live run,
a "profile now" button that leaves a request in the data dir for the collector
(collector.data.requests: the dashboard speaks no gRPC) and says what became of it."""

from __future__ import annotations

import streamlit as st

from app import queries
from collector.data import requests, trace_diff

PROFILE_STEPS = 3


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


def profile_button(data_dir: str, run_id: str, ranks, key: str) -> None:
    """ "Profile now" for ``ranks`` of a live run (the caller shows it only then): the collector asks
    them and a reference rank it picks to profile their next PROFILE_STEPS steps."""
    ranks = [int(r) for r in ranks][: requests.MAX_RANKS]
    asked_key = f"profile-asked-{key}"
    label = f"Profile rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} now"
    if st.button(label, key=f"profile-now-{key}", help="The ranks and a healthy reference profile their next "
                 f"{PROFILE_STEPS} steps; the diff appears here once both traces are in."):  # fmt: skip
        try:
            st.session_state[asked_key] = requests.write(data_dir, run_id, ranks, kind="profile", steps=PROFILE_STEPS)
        except (requests.RequestError, OSError) as exc:
            st.error(f"Could not leave the request in the data dir: {exc}")
    request_id = st.session_state.get(asked_key)
    if request_id:
        rows = trace_diff.request_rows(queries.catalog(data_dir), run_id, request_id)
        st.caption(f"Asked: {requests.outcome(data_dir, request_id, rows)}")
