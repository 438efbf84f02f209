"""Comms: per-op bandwidth over time and by message size, DeepSpeed's log_summary
table, the share of step time spent communicating, and the per-rank breakdown."""

import pandas as pd
import streamlit as st

from app import charts, queries, state, tables
from collector.data.bandwidth import gbps
from collector.data.findings.communication import exposed_shares
from collector.data.findings.stragglers import training_steps

COMM_TABLES = ("comm", "comm_steps")  # what the comm rollup reads
PER_RANK_COLUMNS = {"total_latency_ms": "time in comms (ms)", "wait_ms": "waiting for the last rank (ms)"}


def human_bytes(n: int) -> str:
    """Message sizes the way DeepSpeed's log_summary prints them (KB = 1024 bytes)."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.2f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


def log_summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Columns and units of deepspeed.comm.log_summary(), one row per op x message size."""
    return pd.DataFrame(
        {
            "Comm. Op": summary.op,
            "Message Size": summary.bytes.map(human_bytes),
            "Count": summary["count"],
            "Total Latency(ms)": summary.total_latency_ms,
            "Avg Latency(ms)": summary.avg_latency_ms,
            "tput_avg (Gbps)": gbps(summary.algbw_gbs),
            "busbw_avg (Gbps)": gbps(summary.busbw_gbs),
        }
    )


STEPS_PICKED = "comms.steps"  # the Steps slider's pick, None for the whole run


def filters(dims: dict) -> queries.CommFilter:
    """The page's filters over ``dims``. Drawn inside a live run's refresh, so the Steps slider
    reaches the latest step: its whole range follows the run; a narrower pick stays as picked
    (held here, since a slider whose end moves is a new widget to Streamlit)."""
    c1, c2, c3 = st.columns(3)
    ops = c1.multiselect("Op", dims["ops"], placeholder="all ops", key="comms.ops")
    groups = c2.multiselect("Group", dims["groups"], placeholder="all groups", key="comms.groups")
    ranks = c3.multiselect("Rank", dims["ranks"], placeholder="all ranks", key="comms.ranks")
    steps = None
    first, last = dims["first_step"], dims["last_step"]
    if first is not None and last > first:
        picked = st.session_state.get(STEPS_PICKED)
        shown = (first, last) if picked is None else (max(first, picked[0]), min(last, picked[1]))
        lo, hi = st.slider("Steps", first, last, shown)
        # The full range stays open-ended so a live run keeps showing new steps.
        steps = None if (lo, hi) == (first, last) else (lo, hi)
        st.session_state[STEPS_PICKED] = steps
    return queries.CommFilter(ops, groups, ranks, steps)


def compared(sel: state.Selection, flt: queries.CommFilter) -> None:
    """Per-op busbw and latency of each selected run, side by side."""
    frames = []
    for run_id in sel.run_ids:
        summary = queries.log_summary(sel.data_dir, run_id, queries.data_version(sel.data_dir, run_id), flt)
        per_op = summary.groupby("op").apply(
            lambda g: pd.Series(
                {
                    "count": g["count"].sum(),
                    "avg latency (ms)": g.total_latency_ms.sum() / g["count"].sum(),
                    "busbw (GB/s)": (g.busbw_gbs * g["count"]).sum() / g["count"].sum(),
                }
            ),
            include_groups=False,
        )
        frames.append(per_op.assign(run=f"{sel.run(run_id)['name']} ({run_id})").reset_index())
    st.subheader("Runs compared")
    both = pd.concat(frames)
    if both.empty:
        st.info("Neither run has communication records matching these filters.")
    else:
        st.dataframe(both.pivot(index="op", columns="run", values=["busbw (GB/s)", "avg latency (ms)"]).round(3))


def comms_page() -> None:
    sel = state.selection()
    d, run_id = sel.data_dir, sel.run_id
    dims = queries.comm_dimensions(d, run_id, queries.data_version(d, run_id))
    if not dims["ops"] and not sel.is_live():
        st.info(
            "This run has no communication records (a single rank without collectives, or the comms logger was off)."
        )
        return
    metric = st.radio(
        "Bandwidth",
        ["busbw_gbs", "algbw_gbs"],
        horizontal=True,
        format_func=lambda m: "bus bandwidth" if m.startswith("bus") else "algorithm bandwidth",
    )

    def bandwidth_chart(version: str, flt: queries.CommFilter):
        over_time = queries.bandwidth_by_step(d, run_id, version, flt)
        over_time["series"] = over_time.op + " · " + over_time.group_name
        return charts.lines(
            over_time, "step", metric, "series", "Bandwidth per step", y_title=f"{metric.split('_')[0]} (GB/s)"
        )

    picked = {}  # the filters the last draw used, for the runs compared below

    def body(version: str) -> None:
        dims = queries.comm_dimensions(d, run_id, version)
        flt = picked["flt"] = filters(dims)
        summary = queries.log_summary(d, run_id, version, flt)
        if summary.empty:
            st.info("No communication records match these filters yet.")
            return
        state.retention_notice(d, run_id, version)
        left, right = st.columns(2)
        # built once per version of the comm records and filter (state.memo): unchanged, the
        # browser redraws nothing
        moved = state.tables_version(sel, version, COMM_TABLES)
        left.plotly_chart(
            state.memo(f"comms.bw.{run_id}.{metric}.{flt.key()}", moved, lambda: bandwidth_chart(version, flt))
        )
        live = sel.is_live()  # the envelope and link health read the whole run: at most every SUMMARY_EVERY_S
        band, marks, slow = state.memo(
            f"comms.envelope-data.{run_id}",
            version,
            lambda: queries.busbw_envelope(d, run_id, version),
            at_most_every_s=state.SUMMARY_EVERY_S if live else 0.0,
        )
        if flt.key() == queries.CommFilter().key() and not band.empty:
            # the whole run: the expected envelope, learned from its healthy steps, and what fell out
            right.plotly_chart(
                state.memo(f"comms.envelope.{run_id}", moved, lambda: charts.busbw_envelope(band, marks))
            )
        else:
            right.plotly_chart(
                state.memo(
                    f"comms.size.{run_id}.{flt.key()}",
                    moved,
                    lambda: charts.busbw_vs_size(queries.bandwidth_by_size(d, run_id, version, flt)),
                )
            )
        for finding in slow:
            st.warning(f"Slow link: {finding.text}")
        health = state.memo(
            f"comms.link-health-data.{run_id}",
            version,
            lambda: queries.link_health(d, run_id, version),
            at_most_every_s=state.SUMMARY_EVERY_S if live else 0.0,
        )
        if not health.empty:
            st.plotly_chart(state.memo(f"comms.links.{run_id}", moved, lambda: charts.link_health(health)))

        st.subheader("Summary (deepspeed.comm.log_summary)")
        st.caption("Counts add up every selected rank's records; tput is algbw. Gbps = 8 × GB/s.")
        st.table(log_summary_table(summary).style.format(precision=2, thousands=","), hide_index=True)

        # Per-rank totals leave the warm-up step out unless a step range is picked: its start-up
        # waits (5-10x a later step's) otherwise make the earliest rank look like the worst waiter.
        rank_flt = flt
        if flt.steps is None and queries.training_filter(dims).steps is not None:
            rank_flt = queries.CommFilter(flt.ops, flt.groups, flt.ranks, queries.training_filter(dims).steps)
        per_rank = queries.comm_by_rank(d, run_id, version, rank_flt)
        st.subheader("Per rank")
        if rank_flt is not flt:
            st.caption(f"Steps {rank_flt.steps[0]}-{rank_flt.steps[1]}: the warm-up step is left out.")
        totals = per_rank.groupby("rank", as_index=False)[["total_latency_ms", "wait_ms"]].sum()
        steps = training_steps(queries.step_analysis(d, run_id, version))
        if flt.ranks:
            steps = steps[steps["rank"].isin(flt.ranks)]
        if flt.steps is not None:
            steps = steps[steps.step.between(*flt.steps)]
        shares = {"comm": "in flight", "waiting": "waiting", "transfer": "transfer", "overlapped": "overlaps compute"}
        if not steps.empty and bool(steps.timed.iloc[0]):
            exposed = exposed_shares(steps)[["rank", *shares]].rename(columns=shares)
            totals = totals.merge(exposed, on="rank", how="left")
            st.metric(
                "Share of step time with communication in flight (all ops; mean over ranks)",
                f"{100 * exposed['in flight'].mean():.0f}%",
                help="Per rank and step, the union of its communication intervals inside the step: overlapping "
                "async collectives count once. Waiting: before the instance's last rank arrived; transfer: after.",
            )
        tables.dataframe(
            totals.rename(columns=PER_RANK_COLUMNS),
            hide_index=True,
            column_config={
                name: st.column_config.ProgressColumn(format="percent", min_value=0, max_value=1)
                for name in shares.values()
            },
        )
        by_op = per_rank.pivot_table(index="rank", columns="op", values="total_latency_ms")
        st.caption("Time in each op per rank (ms, summed over the steps shown)")
        tables.dataframe(
            by_op.rename(columns=lambda op: f"{op} (ms)"),
            column_config={"_index": st.column_config.NumberColumn("rank")},
        )

    state.live(sel, body)
    if len(sel.run_ids) > 1:
        compared(sel, picked.get("flt", queries.CommFilter()))


st.title("Comms")
comms_page()
