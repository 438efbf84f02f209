"""Overview: loss, learning rate, loss scale, throughput, step-time breakdown and a
health summary in words for the selected run (loss overlaid when two are picked)."""

import pandas as pd
import streamlit as st

from app import charts, queries, state
from collector.data import findings as diagnosis


def _is_loss(tag: str) -> bool:
    t = tag.lower()
    return "loss" in t and "scale" not in t


def _is_lr(tag: str) -> bool:
    t = tag.lower().rsplit("/", 1)[-1]
    return t in ("lr", "learning_rate") or t.endswith("_lr")


def samples_per_second(series: pd.DataFrame) -> pd.DataFrame:
    """Throughput between consecutive steps from the monitor's cumulative sample counts."""
    per_step = series.groupby("step", as_index=False).agg(samples=("samples", "max"), time_ns=("time_ns", "max"))
    per_step = per_step.dropna().sort_values("step")
    dt = per_step.time_ns.diff()
    per_step["samples_per_s"] = per_step.samples.diff() / dt.where(dt > 0) * 1e9
    return per_step.dropna(subset=["samples_per_s"])


def health_summary(sel: state.Selection, version: str) -> None:
    d, run_id = sel.data_dir, sel.run_id
    everything = queries.CommFilter()
    findings = diagnosis.summarize(
        last_arrivals=queries.last_arrivals(d, run_id, version, everything),
        log_summary=queries.log_summary(d, run_id, version, everything),
        scales=queries.loss_scale(d, run_id, version),
        comm_by_rank=queries.comm_by_rank(d, run_id, version, everything),
        step_wall=queries.step_wall_ms(d, run_id, version),
        world_size=int(sel.run().world_size),
    )
    st.subheader("Health")
    if not findings:
        st.info("Nothing to report yet: no comm, timer or loss-scale records for this run.")
    show = {"critical": st.error, "warning": st.warning, "info": st.info, "ok": st.success}
    for finding in findings:
        show[finding.severity](finding.text)


def monitor_axis(series: pd.DataFrame) -> str:
    """What the monitor charts' x axis is: the training step, or DeepSpeed's sample count where
    that is all the events carry (an imported csv_monitor/tensorboard file: step == samples)."""
    known = series.dropna(subset=["samples"])
    if not known.empty and (known.step == known.samples).all() and known.samples.max() > 0:
        return "samples"
    return "step"


def monitor_chart(series: pd.DataFrame, title: str):
    axis = monitor_axis(series)
    return charts.lines(
        series, "step", "value", "tag", title, x_title=axis, hover={"samples": True} if axis == "step" else None
    )


def training_charts(sel: state.Selection, version: str) -> None:
    d, run_id = sel.data_dir, sel.run_id
    series = queries.monitor_series(d, run_id, version)
    left, right = st.columns(2)
    loss_tags = [t for t in series.tag.unique() if _is_loss(t)]
    lr_tags = [t for t in series.tag.unique() if _is_lr(t)]
    with left:
        if loss_tags:
            st.plotly_chart(monitor_chart(series[series.tag.isin(loss_tags)], "Loss"))
        else:
            st.info("No loss in the monitor events yet.")
    with right:
        if lr_tags:
            st.plotly_chart(monitor_chart(series[series.tag.isin(lr_tags)], "Learning rate"))
        else:
            st.info("No learning rate in the monitor events yet.")

    left, right = st.columns(2)
    with left:
        scales = queries.loss_scale(d, run_id, version)
        if scales.empty:
            st.info("No loss-scale records: this run does not use fp16 dynamic loss scaling.")
        else:
            st.plotly_chart(charts.loss_scale(scales))
    with right:
        throughput = samples_per_second(series) if not series.empty else pd.DataFrame()
        if throughput.empty:
            st.info("No throughput yet: needs monitor events from two steps.")
        else:
            st.plotly_chart(
                charts.lines(
                    throughput, "step", "samples_per_s", None, "Samples per second", x_title=monitor_axis(series)
                )
            )

    timers = queries.step_breakdown(d, run_id, version)
    if timers.empty:
        st.info("No step timers for this run.")
    else:
        st.plotly_chart(charts.step_breakdown(timers))


def compared_loss(sel: state.Selection) -> None:
    frames = []
    for run_id in sel.run_ids:
        series = queries.monitor_series(sel.data_dir, run_id, queries.data_version(sel.data_dir, run_id))
        frames.append(series[series.tag.map(_is_loss)].assign(run=f"{sel.run(run_id)['name']} ({run_id})"))
    both = pd.concat(frames)
    if both.empty:
        st.info("Neither run has loss events to compare.")
    else:
        st.plotly_chart(charts.lines(both, "step", "value", "run", "Loss, compared"))


def overview_page() -> None:
    sel = state.selection()
    run = sel.run()
    st.caption(f"{run['name']} ({sel.run_id}) · {run.status} · world size {run.world_size}")

    def body(version: str) -> None:
        # The summary reads the comm rollup, which a big run builds once (seconds): draw
        # the charts first and fill the summary in above them.
        summary_slot = st.container()
        training_charts(sel, version)
        with summary_slot:
            health_summary(sel, version)

    state.live(sel, body)
    if len(sel.run_ids) > 1:
        compared_loss(sel)


st.title("Overview")
overview_page()
