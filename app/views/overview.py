"""Overview: loss, learning rate, the script's other metrics, loss scale, throughput, step-time
breakdown and a health summary in words for the selected run (loss overlaid when two are picked)."""

from urllib.parse import urlencode

import pandas as pd
import streamlit as st

from app import charts, evidence, queries, state
from collector.data import findings as diagnosis
from collector.data.findings import stragglers


def _is_loss(tag: str) -> bool:
    t = tag.lower()
    return "loss" in t and "scale" not in t


def _is_lr(tag: str) -> bool:
    t = tag.lower().rsplit("/", 1)[-1]
    return t in ("lr", "learning_rate") or t.endswith("_lr")


def _is_loss_scale(tag: str) -> bool:
    return "scale" in tag.lower().rsplit("/", 1)[-1]


def _is_throughput(tag: str) -> bool:
    t = tag.lower().rsplit("/", 1)[-1].replace("/", "_")
    return t in ("samples_per_sec", "samples_per_s", "samples_per_second", "throughput")


def split_tags(tags) -> dict[str, list[str]]:
    """Each monitor tag in the one chart that draws it: loss, lr, loss scale (its own log2 chart),
    throughput (the samples/s chart) and the rest ("Other metrics", one chart each)."""
    out: dict[str, list[str]] = {"loss": [], "lr": [], "scale": [], "throughput": [], "other": []}
    for tag in tags:
        kind = (
            "scale"
            if _is_loss_scale(tag)
            else "loss"
            if _is_loss(tag)
            else "lr"
            if _is_lr(tag)
            else "throughput"
            if _is_throughput(tag)
            else "other"
        )
        out[kind].append(tag)
    return out


def no_throughput_message(series: pd.DataFrame, live: bool) -> str:
    """Why the samples/s chart is missing: a live run may still get there; a finished one will not."""
    counted = series.dropna(subset=["samples"]).step.nunique() if not series.empty else 0
    if live:
        return "No throughput yet: needs sample counts in the monitor events of two steps."
    if counted == 1:
        return "No throughput: this run's monitor events carry a sample count at one step only."
    return (
        "No throughput: this run has no samples/s and no sample counts in its monitor events "
        "(the engine's monitor logs them; a script with the hook logs what it passes to `hook.log`)."
    )


def samples_per_second(series: pd.DataFrame) -> pd.DataFrame:
    """Throughput between consecutive steps from the monitor's cumulative sample counts."""
    per_step = series.groupby("step", as_index=False).agg(samples=("samples", "max"), time_ns=("time_ns", "max"))
    per_step = per_step.dropna().sort_values("step")
    dt = per_step.time_ns.diff()
    per_step["samples_per_s"] = per_step.samples.diff() / dt.where(dt > 0) * 1e9
    return per_step.dropna(subset=["samples_per_s"])


def finding_link(finding: diagnosis.Finding, run_id: str) -> str:
    """Markdown link to the page (and filter) that proves a finding."""
    if not finding.page:
        return ""
    params = urlencode({"run": run_id, **finding.filters}, doseq=True)
    return f" [→ {finding.page}](/{finding.page}?{params})"


def findings_of(sel: state.Selection, version: str) -> list:
    d, run_id = sel.data_dir, sel.run_id
    run = sel.run()
    return diagnosis.summarize(
        steps=queries.step_analysis(d, run_id, version),
        log_summary=queries.log_summary(
            d, run_id, version, queries.training_filter(queries.comm_dimensions(d, run_id, version))
        ),
        scales=queries.loss_scale(d, run_id, version),
        world_size=int(run.world_size),
        source=run.get("source"),
        config=run.get("config"),
        signals=queries.signals_by_step(d, run_id, version),
        hangs=queries.hangs(d, run_id, version),
        desyncs=queries.desyncs(d, run_id, version),
        liveness=queries.rank_liveness(d, run_id, version),
        moe=queries.moe_load(d, run_id, version),
        losses=queries.loss_series(d, run_id, version),
        memory=queries.memory_trend(d, run_id, version),
        clock=queries.clock_skew(d, run_id, version),
        links=queries.link_frames(d, run_id, version),
        pipeline=queries.pipe_bubbles(d, run_id, version),
        **queries.link_evidence(d, run_id, version),
    )


def health_summary(sel: state.Selection, version: str) -> None:
    d, run_id = sel.data_dir, sel.run_id
    # The findings read most of the run (the comm rollup, every step's analysis): while it is live
    # they follow the data at most every SUMMARY_EVERY_S; the cost chart below follows every version.
    findings, nothing_yet = state.memo(
        f"overview.findings.{run_id}",
        version,
        lambda: (findings_of(sel, version), queries.step_analysis(d, run_id, version).empty),
        at_most_every_s=state.SUMMARY_EVERY_S if sel.is_live() else 0.0,
    )
    st.subheader("Health")
    problems = [f for f in findings if f.severity in ("critical", "warning")]
    notes = [f for f in findings if f.severity == "info"]
    if nothing_yet and not findings:
        st.info("Nothing to report yet: no comm, timer or loss-scale records for this run.")
    elif not problems:
        st.success("Healthy: no straggler, hang or overflow to fix.")
    show = {"critical": st.error, "warning": st.warning}
    captured = evidence.captured(d, run_id) if problems else []
    live = sel.is_live()
    for i, finding in enumerate(problems):
        show[finding.severity](finding.text + finding_link(finding, run_id))
        for found in captured:
            if found.get("suspect") in finding.ranks:
                evidence.show(d, found)
        if live and finding.ranks:  # ask the ranks now rather than wait for the escalation
            evidence.profile_button(d, run_id, finding.ranks[:4], key=f"overview-{run_id}-{finding.kind}-{i}")
    for finding in notes:
        st.info(finding.text + finding_link(finding, run_id))
    if any(f.kind == "straggler" for f in findings):
        st.plotly_chart(
            state.memo(
                f"overview.cost.{run_id}",
                version,
                lambda: straggler_cost_chart(queries.step_analysis(d, run_id, version)),
            )
        )


def straggler_cost_chart(steps: pd.DataFrame):
    """Step time against the what-if step time had no rank been late."""
    per_step = stragglers.step_costs(stragglers.training_steps(steps))
    long = per_step.melt(id_vars="step", value_vars=["step_ms", "what_if_ms"], var_name="series", value_name="ms")
    long["series"] = long.series.map({"step_ms": "step time", "what_if_ms": "without late arrivals"})
    return charts.lines(long, "step", "ms", "series", "Straggler cost: step time vs. what-if", y_title="ms per step")


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


# Each chart is a section: what it draws is a list of items ("chart", figure) / ("info", text) /
# ("missing", (table, text)), built again only when the tables it reads moved (state.memo under
# state.tables_version) and otherwise sent unchanged, which the browser does not redraw.


def draw(sel: state.Selection, items: list) -> None:
    for kind, what in items:
        if kind == "chart":
            st.plotly_chart(what)
        elif kind == "info":
            st.info(what)
        else:
            state.missing_data(sel, *what)


def monitor_items(sel: state.Selection, version: str, kind: str) -> list:
    """The chart of one kind of monitor tags (loss, lr, other, throughput), or why there is none."""
    series = queries.monitor_series(sel.data_dir, sel.run_id, version)
    tags = split_tags(series.tag.unique())
    live = sel.is_live()
    if kind == "loss":
        if series.empty:
            return [("missing", ("monitor", "No monitor events (loss, learning rate, samples) in this run."))]
        if tags["loss"]:
            return [("chart", monitor_chart(series[series.tag.isin(tags["loss"])], "Loss"))]
        return [("info", "No loss in the monitor events" + (" yet." if live else "."))]
    if kind == "lr":
        if tags["lr"]:
            return [("chart", monitor_chart(series[series.tag.isin(tags["lr"])], "Learning rate"))]
        return [] if series.empty else [("info", "No learning rate in the monitor events" + (" yet." if live else "."))]
    if kind == "other":
        return [("chart", monitor_chart(series[series.tag == tag], f"Other metrics: {tag}")) for tag in tags["other"]]
    # throughput
    if tags["throughput"]:
        rate = series[series.tag.isin(tags["throughput"])]
        return [
            (
                "chart",
                charts.lines(
                    rate,
                    "step",
                    "value",
                    "tag" if len(tags["throughput"]) > 1 else None,
                    "Samples per second",
                    y_title="samples/s",
                    x_title=monitor_axis(series),
                ),
            )
        ]
    throughput = samples_per_second(series) if not series.empty else pd.DataFrame()
    if throughput.empty:
        return [("info", no_throughput_message(series, live))]
    return [
        (
            "chart",
            charts.lines(
                throughput,
                "step",
                "samples_per_s",
                None,
                "Samples per second",
                y_title="samples/s",
                x_title=monitor_axis(series),
            ),
        )
    ]


def loss_scale_items(sel: state.Selection, version: str) -> list:
    d, run_id = sel.data_dir, sel.run_id
    scales = queries.loss_scale(d, run_id, version)
    if scales.empty:  # a monitor's own loss_scale tag (an imported csv_monitor)
        series = queries.monitor_series(d, run_id, version)
        logged = split_tags(series.tag.unique())["scale"]
        if logged:
            rows = series[series.tag == logged[0]]
            scales = pd.DataFrame({"step": rows.step, "scale": rows.value, "overflow": False, "bad_params": ""})
    if scales.empty:
        return [("missing", ("loss_scale", "No loss-scale records: this run does not use fp16 dynamic loss scaling."))]
    return [("chart", charts.loss_scale(scales))]


def timer_items(sel: state.Selection, version: str) -> list:
    timers = queries.step_breakdown(sel.data_dir, sel.run_id, version)
    if timers.empty:
        return [("info", "No step timers for this run.")]
    return [("chart", charts.step_breakdown(timers))]


def section(sel: state.Selection, version: str, name: str, tables: tuple[str, ...], items) -> None:
    """Draw ``items(version)``, built again only when ``tables`` moved (state.memo)."""
    moved = state.tables_version(sel, version, tables)
    draw(sel, state.memo(f"overview.{name}.{sel.run_id}", moved, lambda: items(version)))


def training_charts(sel: state.Selection, version: str) -> None:
    monitor = ("monitor",)
    left, right = st.columns(2)
    with left:
        section(sel, version, "loss", monitor, lambda v: monitor_items(sel, v, "loss"))
    with right:
        section(sel, version, "lr", monitor, lambda v: monitor_items(sel, v, "lr"))
    # what else the script logs (hook.log, a monitor's own tags): grad norm, tokens, accuracy...
    # one chart each, so a metric in the millions does not flatten one in the tens
    section(sel, version, "other", monitor, lambda v: monitor_items(sel, v, "other"))
    left, right = st.columns(2)
    with left:
        section(sel, version, "scale", ("loss_scale", "monitor"), lambda v: loss_scale_items(sel, v))
    with right:
        section(sel, version, "throughput", monitor, lambda v: monitor_items(sel, v, "throughput"))
    section(sel, version, "timers", ("timers",), lambda v: timer_items(sel, v))


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
