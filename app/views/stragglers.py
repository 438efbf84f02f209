"""Stragglers: who arrives late to each collective, and who waits for them.

Arrival delay = a rank's start minus the first rank's start of the same collective
instance (run, group, seq); wait = the last rank's start minus this rank's start.
Click a heatmap cell to list the collective instances behind it."""

import pandas as pd
import streamlit as st

from app import charts, queries, state
from collector.data.findings import duration

HEATMAP_KEY = "delay_heatmap"


def rank_labels(ranks: pd.DataFrame) -> dict[int, str]:
    """Rank -> label, ordered by host when the run spans several hosts."""
    if ranks.empty:
        return {}
    if ranks.host.nunique() <= 1:
        return {int(r): f"rank {int(r)}" for r in ranks["rank"]}
    ordered = ranks.sort_values(["host", "rank"])
    return {int(r.rank): f"{r.host} · rank {int(r.rank)}" for r in ordered.itertuples()}


def clicked_cell(labels: dict[int, str]) -> tuple[int, int] | None:
    """(rank, step) of the heatmap cell the user clicked, if any."""
    event = st.session_state.get(HEATMAP_KEY)
    points = event.selection.points if event is not None else []
    if not points:
        return None
    by_label = {label: r for r, label in labels.items()}
    label = points[0].get("y")
    rank = by_label.get(label)
    if rank is None and isinstance(label, str) and label.startswith("rank "):
        rank = int(label.split()[-1])
    return None if rank is None else (rank, int(points[0]["x"]))


def drill_down(sel: state.Selection, version: str, labels: dict[int, str], dims: dict) -> None:
    st.subheader("Collective instances behind a cell")
    if dims["first_step"] is None:
        return
    cell = clicked_cell(labels)
    c1, c2 = st.columns(2)
    ranks = dims["ranks"]
    rank = c1.selectbox(
        "Rank",
        ranks,
        index=ranks.index(cell[0]) if cell and cell[0] in ranks else len(ranks) - 1,
        format_func=lambda r: labels.get(r, f"rank {r}"),
    )
    first, last = dims["first_step"], dims["last_step"]
    step = c2.number_input("Step", min_value=first, max_value=last, value=cell[1] if cell else first, step=1)
    instances = queries.instances_at(sel.data_dir, sel.run_id, version, int(step), int(rank))
    if instances.empty:
        st.info(f"Rank {rank} ran no collectives at step {step}.")
    else:
        st.dataframe(instances, hide_index=True)


def stragglers_page() -> None:
    sel = state.selection()
    d, run_id = sel.data_dir, sel.run_id
    dims = queries.comm_dimensions(d, run_id, queries.data_version(d, run_id))
    if not dims["ops"] and not sel.is_live():
        st.info("This run has no communication records, so there is nothing to compare across ranks.")
        return
    c1, c2 = st.columns(2)
    ops = c1.multiselect("Op", dims["ops"], placeholder="all ops")
    groups = c2.multiselect("Group", dims["groups"], placeholder="all groups")
    flt = queries.CommFilter(ops, groups)

    def body(version: str) -> None:
        ranks = queries.ranks(d, run_id, version)
        labels = rank_labels(ranks)
        last = queries.last_arrivals(d, run_id, version, flt)
        if last.empty:
            st.info("No collectives match these filters yet.")
            return
        for op, rows in last.groupby("op"):
            worst = rows.loc[rows.share.idxmax()]
            st.markdown(
                f"**{op}**: rank {int(worst['rank'])} arrives last in {100 * worst.share:.0f}% "
                f"of instances (+{duration(worst.mean_lead_ms)} on average)"
            )
        st.plotly_chart(charts.last_rank_bars(last))

        grid = queries.delay_heatmap(d, run_id, version, flt)
        st.plotly_chart(
            charts.heatmap(
                grid, "arrival_delay_ms", "Arrival delay per collective (mean ms)", y_labels=labels, clickable=True
            ),
            key=HEATMAP_KEY,
            on_select="rerun",
            selection_mode="points",
        )
        st.plotly_chart(
            charts.heatmap(grid, "wait_ms", "Time waiting for the last rank (mean ms per collective)", y_labels=labels)
        )
        if ranks.host.nunique() > 1:
            per_host = (
                grid.merge(ranks[["rank", "host"]], on="rank")
                .groupby("host", as_index=False)
                .agg(
                    ranks=("rank", "nunique"),
                    arrival_delay_ms=("arrival_delay_ms", "mean"),
                    wait_ms=("wait_ms", "mean"),
                    times_last=("n_last", "sum"),
                )
            )
            st.subheader("By host")
            st.dataframe(per_host, hide_index=True)
        drill_down(sel, version, labels, queries.comm_dimensions(d, run_id, version))

    state.live(sel, body)


st.title("Stragglers")
stragglers_page()
