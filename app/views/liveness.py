"""Liveness: who is stuck where, who never arrived, and their stacks.

The wavefront shows, per rank (or rank range, for worlds too big to show one row per
rank) and process group, the last collective seq each rank entered and completed: a
stuck collective is where the entered column runs ahead of the completed one, and the
ranks missing from it lag behind both. The stacks are each rank's latest capture: the
ones a rank took itself when a collective crossed ``hang_after_s``, and the ones the
collector asked of the ranks missing from it (or of silent ranks); ranks with the same
stacks share one entry.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts, queries, state, tables
from collector.data.findings.model import ranks_label

EXPANDED_STACK_GROUPS = 3  # the odd ones out (fewest ranks) open; the rest one click away


def same_stacks(stacks: pd.DataFrame) -> list[tuple[list[int], pd.DataFrame]]:
    """Ranks whose latest capture is the same (step, reason and every thread's stack), one group
    each, fewest ranks first: in a 1,024-rank hang the stuck rank's stack comes first and the
    1,023 waiting ranks' identical ones are one entry, not a thousand."""
    groups: dict[tuple, tuple[list[int], pd.DataFrame]] = {}
    for rank, threads in stacks.groupby("rank", sort=True):
        first = threads.iloc[0]
        key = (first["step"], first["reason"], *zip(threads["thread_name"], threads["is_main"], threads["stack"]))
        groups.setdefault(key, ([], threads))[0].append(int(rank))
    return sorted(groups.values(), key=lambda g: (len(g[0]), g[0][0]))


def behind(wave: pd.DataFrame) -> pd.DataFrame:
    """The wavefront with ``behind``: per row, how many collective seqs its slowest rank has yet to
    enter to reach the group's furthest rank (its own group's: seqs of two groups do not compare).
    In a hang the ranks waiting in the stuck collective are 0 behind, the one missing from it 1."""
    furthest = wave.groupby("group_name").max_entered.transform("max")
    return wave.assign(behind=(furthest - wave.min_entered).astype(int))


def liveness_page() -> None:
    sel = state.selection()

    def body(version: str) -> None:
        d, run_id = sel.data_dir, sel.run_id
        hangs = queries.hangs(d, run_id, version)
        st.subheader("Stuck collectives")
        if hangs.empty:
            state.missing_data(sel, "stacks", "No collective is stuck in this run.")
        else:
            tables.dataframe(
                hangs[["group_name", "seq", "op", "step", "waiting_s", "waiting_ranks", "missing_ranks"]],
                hide_index=True,
                column_config={"waiting_s": st.column_config.NumberColumn("waiting (s)", format="%.1f")},
            )
        liveness = queries.rank_liveness(d, run_id, version)
        if liveness.empty:
            st.info("No heartbeats for this run: it was recorded without the rank-side watchdog.")
        st.subheader("Wavefront")
        wave = queries.wavefront(d, run_id, version)
        if wave.empty:
            st.info("No collectives recorded for this run yet.")
        else:
            if (wave.ranks > 1).any():
                st.caption("Ranks are binned: each row is a rank range; min/max over the range.")
            st.plotly_chart(charts.wavefront(wave))
            st.caption(
                "behind: how many collectives the row's slowest rank has yet to enter "
                "to reach the furthest rank of its group."
            )
            tables.dataframe(behind(wave), hide_index=True)
        st.subheader("Stacks")
        stacks = queries.stacks(d, run_id, version)
        if stacks.empty:
            st.info("No stacks captured: none is taken until a collective hangs or the collector asks.")
        for i, (ranks, threads) in enumerate(same_stacks(stacks)):
            first = threads.iloc[0]
            # labels are markdown: op names' underscores would turn into italics
            label = f"{ranks_label(ranks)} · step {first.step} · {first.reason}".replace("_", "\\_")
            with st.expander(label, expanded=i < EXPANDED_STACK_GROUPS):
                for t in threads.itertuples(index=False):
                    st.markdown(f"**{t.thread_name}**{' (main)' if t.is_main else ''} — `{t.innermost}`")
                    st.code(t.stack, language="text")

    state.live(sel, body)


st.title("Liveness")
liveness_page()
