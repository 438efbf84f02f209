"""Memory: each rank's bytes by kind (params, grads, optimizer, rss, device) over steps."""

import streamlit as st

from app import charts, queries, state


def memory_page() -> None:
    sel = state.selection()

    def body(version: str) -> None:
        memory = queries.memory_by_step(sel.data_dir, sel.run_id, version)
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
        memory = memory[memory.kind.isin(shown)].assign(GiB=lambda f: f.bytes / 2**30)
        for kind, rows in memory.groupby("kind"):
            st.plotly_chart(charts.per_rank_lines(rows, "step", "GiB", f"{kind} per rank", y_title="GiB"))

    state.live(sel, body)


st.title("Memory")
memory_page()
