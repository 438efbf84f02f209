"""Memory: each rank's bytes by kind (params, grads, optimizer, rss, device) over steps; beyond a
few ranks, the ranks with the highest peak and the median and max over all (queries.memory_lines)."""

import streamlit as st

from app import charts, queries, state
from collector.data import binning


def memory_page() -> None:
    sel = state.selection()

    def body(version: str) -> None:
        memory = queries.memory_lines(sel.data_dir, sel.run_id, version, binning.TOP_K)
        if memory.empty:
            state.missing_data(
                sel,
                "memory",
                "No memory records in this run (the engine reports them each step; "
                "scripts using only the hook do not).",
            )
            return
        kinds = sorted(memory.kind.unique())
        shown = st.multiselect("Kind", kinds, default=kinds)
        memory = memory[memory.kind.isin(shown)]
        for kind, rows in memory.groupby("kind"):
            many = rows.series.str.startswith("median").any()
            title = f"{kind} per rank" + (f" (the {binning.TOP_K} highest, median and max)" if many else "")
            # KiB, MiB or GiB: whichever fits the data; built once per version of the memory records
            st.plotly_chart(
                state.memo(
                    f"memory.{sel.run_id}.{kind}",
                    state.tables_version(sel, version, ("memory",)),
                    lambda rows=rows, t=title: charts.memory_lines(rows, t),
                )
            )

    state.live(sel, body)


st.title("Memory")
memory_page()
