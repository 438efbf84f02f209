"""Stragglers: who arrives late to each collective, and who waits for them.

Arrival delay = a rank's start minus the first rank's start of the same collective
instance (run, group, seq); wait = the last rank's start minus this rank's start.

Readable at any world size (collector/data/binning.py): while the ranks fit, the heatmaps
have a row per rank; beyond that a row per host or rank range showing the bin's max (hover:
p95 and the rank behind the max), worst bins first, and any bin opens into its ranks. The
last-arrival chart shows the few worst ranks per op, and the sentences name the ranks that
arrive last beyond chance (collector/data/findings/stragglers.py), with the evidence profiled
from suspects (app/evidence.py) under them. Click a cell to list the collective instances behind it."""

import pandas as pd
import streamlit as st

from app import charts, evidence, queries, state, tables
from collector.data import binning, whatif
from collector.data.findings.stragglers import late_ranks
from collector.data.findings.whatif import describe

HEATMAP_KEY = "delay_heatmap"
OPEN_BIN_KEY = "open_bin"


def rank_labels(ranks: pd.DataFrame) -> dict[int, str]:
    """Rank -> label, ordered by host when the run spans several hosts."""
    bins = binning.bin_ranks(ranks, max_rows=max(1, len(ranks)))
    return dict(zip(bins["rank"].astype(int), bins.label, strict=True))


def clicked_cell(labels: dict[int, str]) -> tuple[int, int] | None:
    """(rank, step) of the per-rank heatmap cell the user clicked, if any."""
    point = _clicked_point()
    if point is None:
        return None
    label, step = point
    by_label = {label: r for r, label in labels.items()}
    rank = by_label.get(label)
    if rank is None and isinstance(label, str) and label.startswith("rank "):
        rank = int(label.split()[-1])
    return None if rank is None else (rank, step)


def _clicked_point() -> tuple[str, int] | None:
    event = st.session_state.get(HEATMAP_KEY)
    points = event.selection.points if event is not None else []
    if not points:
        return None
    return points[0].get("y"), int(points[0]["x"])


def drill_down(sel: state.Selection, version: str, labels: dict[int, str], dims: dict, cell) -> None:
    st.subheader("Collective instances behind a cell")
    if dims["first_step"] is None:
        return
    c1, c2 = st.columns(2)
    ranks = dims["ranks"]
    rank = c1.selectbox(  # type to search: thousands of ranks
        "Rank",
        ranks,
        help="Type to search among the run's ranks.",
        index=ranks.index(cell[0]) if cell and cell[0] in ranks else len(ranks) - 1,
        format_func=lambda r: labels.get(r, f"rank {r}"),
    )
    first, last = dims["first_step"], dims["last_step"]
    step = c2.number_input("Step", min_value=first, max_value=last, value=cell[1] if cell else first, step=1)
    if sel.is_live():  # what this rank does in its steps, from now
        evidence.profile_button(sel.data_dir, sel.run_id, [int(rank)], key=f"drill-{sel.run_id}")
    instances = queries.instances_at(sel.data_dir, sel.run_id, version, int(step), int(rank))
    retained = queries.retention(sel.data_dir, sel.run_id, version)
    if instances.empty and retained and step <= retained["through"]:
        near = ", ".join(map(str, queries.raw_steps_near(sel.data_dir, sel.run_id, version, int(step))))
        st.info(f"The raw records of step {step} were not kept (retention). Steps kept raw near it: {near}.")
    elif instances.empty:
        st.info(f"Rank {rank} ran no collectives at step {step}.")
    else:
        tables.dataframe(
            instances,
            hide_index=True,
            column_config={
                "arrival_delay_ms": st.column_config.NumberColumn("arrival delay (ms)", format="localized"),
                "wait_ms": st.column_config.NumberColumn("wait (ms)", format="localized"),
            },
        )


def summary_sentences(last: pd.DataFrame, world_size: int) -> list[str]:
    found = {f.evidence["op"]: f.text for f in late_ranks(last, world_size)}
    return [
        f"**{op}**: {found.get(op, 'no rank arrives last more often than chance would have it')}"
        for op in sorted(last.op.unique())
    ]


def worst_last_arrivals(last: pd.DataFrame) -> pd.DataFrame:
    """Per op, the TOP_K ranks arriving last most often (no 'others' bar: shares of the rest are tiny)."""
    return pd.concat(
        [binning.top_k(rows, "share", others=False).assign(op=op) for op, rows in last.groupby("op")],
        ignore_index=True,
    )


def per_rank_heatmaps(
    grid: pd.DataFrame, labels: dict[int, str], clickable: bool, memo_key: str = "", version: str = ""
) -> None:
    """The two rank x step heatmaps; with ``memo_key``, built once per data ``version`` (state.memo)."""
    kwargs = dict(key=HEATMAP_KEY, on_select="rerun", selection_mode="points") if clickable else {}

    def delay():
        return charts.heatmap(
            grid, "arrival_delay_ms", "Arrival delay per collective (mean ms)", y_labels=labels, clickable=clickable
        )

    def wait():
        return charts.heatmap(
            grid, "wait_ms", "Time waiting for the last rank (mean ms per collective)", y_labels=labels
        )

    if memo_key:
        st.plotly_chart(state.memo(f"{memo_key}.delay", version, delay), **kwargs)
        st.plotly_chart(state.memo(f"{memo_key}.wait", version, wait))
    else:
        st.plotly_chart(delay(), **kwargs)
        st.plotly_chart(wait())


def binned_heatmaps(
    sel: state.Selection, version: str, flt: queries.CommFilter, grid: pd.DataFrame, bins: pd.DataFrame, labels
) -> tuple[int, int] | None:
    """The heatmaps by bin (binned in SQL: queries.binned_delay), and the bin the user opened;
    returns the (rank, step) a click points at."""
    kind = "host" if bins.kind.iloc[0] == "host" else "rank range"
    delay = queries.binned_delay(sel.data_dir, sel.run_id, version, flt, bins, "arrival_delay_ms")
    st.caption(
        f"{len(labels):,} ranks in {bins.bin.nunique()} bins by {kind}, worst first: colour is the bin's max "
        "mean arrival delay, hover shows its p95 and the rank behind the max. Click a cell (on a large map, a row's "
        "◂ at the right: the bin's worst cell) or pick a bin to open it."
        + (
            f" Each column is {width} steps (labelled by its first)."
            if (width := binning.step_width(grid.step)) > 1
            else ""
        )
    )
    st.plotly_chart(
        charts.binned_heatmap(delay, "Arrival delay per collective (max per bin, mean ms)", clickable=True),
        key=HEATMAP_KEY,
        on_select="rerun",
        selection_mode="points",
    )
    st.plotly_chart(
        charts.binned_heatmap(
            queries.binned_delay(sel.data_dir, sel.run_id, version, flt, bins, "wait_ms"),
            "Time waiting for the last rank (max per bin, mean ms)",
        )
    )
    order = delay.drop_duplicates("order").sort_values("order")
    cell = None
    point = _clicked_point()
    if point is not None:
        cell = binning.cell_at(delay, *point)
        if cell is not None:
            st.session_state[OPEN_BIN_KEY] = point[0]
    choices = order.label.tolist()
    if st.session_state.get(OPEN_BIN_KEY) not in choices:
        st.session_state[OPEN_BIN_KEY] = choices[0]
    opened = st.selectbox("Open bin", choices, key=OPEN_BIN_KEY, help="Type to search by host or rank range.")
    members = set(bins[bins.label == opened]["rank"])
    inside = grid[grid["rank"].isin(members)]
    st.plotly_chart(
        charts.heatmap(inside, "arrival_delay_ms", f"{opened}: arrival delay per rank (mean ms)", y_labels=labels)
    )
    return cell


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
        # Who arrives last counts the training steps: the warm-up step's start-up broadcasts (one
        # per tensor, from rank 0) would otherwise name whichever rank loads its model last.
        steps = queries.training_filter(queries.comm_dimensions(d, run_id, version)).steps
        last = queries.last_arrivals(d, run_id, version, queries.CommFilter(ops, groups, steps=steps))
        if last.empty:
            st.info("No collectives match these filters yet.")
            return
        state.retention_notice(d, run_id, version)
        # The sentences sit above the charts but are worked out after them: a chart first.
        sentences = st.container()
        key = f"stragglers.{run_id}.{flt.key()}"
        moved = state.tables_version(sel, version, ("comm", "comm_steps", "ranks"))  # the rollup and the labels
        st.plotly_chart(state.memo(f"{key}.last", moved, lambda: charts.last_rank_bars(worst_last_arrivals(last))))

        grid = queries.delay_heatmap(d, run_id, version, flt)
        bins = binning.bin_ranks(ranks if not ranks.empty else grid[["rank"]].drop_duplicates())
        if bins.kind.iloc[0] == "rank":
            per_rank_heatmaps(grid, labels, clickable=True, memo_key=key, version=moved)
            cell = clicked_cell(labels)
            if cell is not None and cell[1] > grid.step.max():  # a row's handle (a map too big for a marker per cell)
                mine = grid[grid["rank"] == cell[0]]
                cell = (cell[0], int(mine.step.iloc[mine.arrival_delay_ms.argmax()])) if len(mine) else None
        else:
            cell = binned_heatmaps(sel, version, flt, grid, bins, labels)
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
                .sort_values(["arrival_delay_ms", "host"], ascending=[False, True])
            )
            st.subheader("By host (slowest first)")
            tables.dataframe(per_host, hide_index=True)
        with sentences:
            world = max(len(ranks), int(last["rank"].max()) + 1)
            for sentence in summary_sentences(last, world):
                st.markdown(sentence)
            for found in evidence.captured(d, run_id):  # what the suspects did, if profiled
                evidence.show(d, found)
        whatif_section(sel, version)
        drill_down(sel, version, labels, queries.comm_dimensions(d, run_id, version), cell)

    state.live(sel, body)


def whatif_section(sel: state.Selection, version: str) -> None:
    """The what-if replay's verdict and its worker x step heatmap (the OSDI'25 study's Fig. 14),
    where the run has the ops the replay models (docs/whatif.md). It replays every step of every
    rank: a live run's follows the data at most every SUMMARY_EVERY_S."""
    result = state.memo(
        f"stragglers.whatif.{sel.run_id}",
        version,
        lambda: queries.whatif_result(sel.data_dir, sel.run_id, version),
        at_most_every_s=state.SUMMARY_EVERY_S if sel.is_live() else 0.0,
    )
    if result is None:
        return
    st.subheader("What-if: how much faster without stragglers, and whose they are")
    verdict = describe(result)
    st.markdown(
        f"Slowdown S = **{result['slowdown']:.2f}x** over {result['steps']} steps "
        f"(M_W {result['m_w'] or 0:.0%}, M_S {result['m_s'] or 0:.0%}). "
        + (verdict.text if verdict else "The steps run as fast as their typical ops allow.")
    )
    grid = whatif.worker_steps(result)
    worst = grid.groupby("rank", as_index=False).slowdown.max()
    title = "Worker x step slowdown (1 = no straggling)"
    if len(worst) > binning.MAX_ROWS:  # 1,024 rows are unreadable and heavy: the slowest workers
        kept = binning.top_k(worst, "slowdown", binning.MAX_ROWS, others=False)["rank"]
        grid = grid[grid["rank"].isin(kept)]
        title += f", the {binning.MAX_ROWS} slowest of {len(worst):,} workers"
    labels = dict(zip(grid["rank"], grid["label"]))
    st.plotly_chart(charts.heatmap(grid, "slowdown", title, y_labels=labels, colorbar="x"))


st.title("Stragglers")
stragglers_page()
