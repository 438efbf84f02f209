"""FLOPS: the flops profiler's module tree (latest profiled step), the top modules
per depth, per-rank comparison, and the detailed per-module table."""

import pandas as pd
import plotly.express as px
import streamlit as st

from app import charts, queries, state, tables
from collector.data import binning

SIZE_BY = {"flops": "flops", "fwd latency": "latency_ns", "params": "params"}


def detailed_table(tree: pd.DataFrame) -> pd.DataFrame:
    """The profiler's detailed profile: params, MACs and fwd latency, each with its share of
    the model total, and achieved fwd FLOPS."""
    root = tree[tree.depth == 0].iloc[0] if (tree.depth == 0).any() else tree.sum(numeric_only=True)

    def share(column: str) -> pd.Series:
        return (tree[column] / root[column] * 100).round(2) if root[column] else pd.Series(0.0, index=tree.index)

    latency_s = tree.latency_ns.where(tree.latency_ns > 0) / 1e9
    return pd.DataFrame(
        {
            "module": tree.module.replace("", "(model)"),
            "type": tree.module_type,
            "depth": tree.depth,
            "params": tree.params,
            "% params": share("params"),
            "MACs": tree.macs,
            "% MACs": share("macs"),
            "fwd latency (ms)": (tree.latency_ns / 1e6).round(3),
            "% fwd latency": share("latency_ns"),
            "fwd FLOPS (TFLOPS)": (tree.flops / latency_s / 1e12).round(4),
            "bwd latency (ms)": (tree.bwd_latency_ns / 1e6).round(3),
        }
    )


def top_modules(tree: pd.DataFrame, k: int) -> pd.DataFrame:
    """Like the profiler's aggregated profile: per depth, module types summed, top k by each metric."""
    agg = tree.groupby(["depth", "module_type"], as_index=False)[["params", "macs", "latency_ns"]].sum()
    rows = []
    for depth, at_depth in agg.groupby("depth"):
        row = {"depth": depth}
        for metric, label in (("params", "params"), ("macs", "MACs"), ("latency_ns", "fwd latency")):
            best = at_depth.nlargest(k, metric)
            fmt = (lambda v: f"{v / 1e6:.2f} ms") if metric == "latency_ns" else (lambda v: f"{v:.3g}")
            row[label] = ", ".join(f"{t}: {fmt(v)}" for t, v in zip(best.module_type, best[metric], strict=True))
        rows.append(row)
    return pd.DataFrame(rows)


def measured(modules: pd.DataFrame) -> pd.DataFrame:
    """The modules with a fwd latency of their own on some rank: a container (ModuleList,
    ModuleDict) is never called itself, so the profiler times nothing for it and its bar would be
    empty; its children are timed where they run."""
    timed = modules.groupby("module").latency_ns.transform("max") > 0
    return modules[timed]


def flops_page() -> None:
    sel = state.selection()

    def body(version: str) -> None:
        profile = queries.flops_profile(sel.data_dir, sel.run_id, version)
        if profile.empty:
            state.missing_data(
                sel,
                "flops",
                "No flops profile in this run. Enable it with the DeepSpeed config's "
                '`"flops_profiler": {"enabled": true, "profile_step": N}`.',
            )
            return
        ranks = sorted(profile["rank"].unique())
        st.caption(f"Profiled at step {int(profile.step.iloc[0])} on ranks {', '.join(map(str, ranks))}.")
        c1, c2, c3 = st.columns(3)
        rank = c1.selectbox("Rank", ranks)
        kind = c2.radio("Chart", ["icicle", "treemap", "sunburst"], horizontal=True)
        size_by = c3.radio("Size by", list(SIZE_BY), horizontal=True)
        tree = profile[profile["rank"] == rank].reset_index(drop=True)
        st.plotly_chart(
            state.memo(
                f"flops.{sel.run_id}.{rank}.{kind}.{size_by}",
                state.tables_version(sel, version, ("flops",)),
                lambda: charts.module_tree(tree, kind, SIZE_BY[size_by]),
            )
        )

        st.subheader("Top modules per depth")
        k = st.number_input("Top k", min_value=1, max_value=20, value=3)
        tables.dataframe(top_modules(tree, int(k)), hide_index=True)

        st.subheader("Per-rank comparison")
        shallow = measured(profile[profile.depth == 1]).assign(latency_ms=lambda f: f.latency_ns / 1e6)
        # the slowest ranks (by their top-level modules' total) and the median of the rest, not a bar per rank
        totals = shallow.groupby("rank", as_index=False).latency_ms.sum()
        worst = binning.top_k(totals, "latency_ms", others=False)
        shown = shallow[shallow["rank"].isin(worst["rank"])].assign(label=lambda f: "rank " + f["rank"].astype(str))
        rest = shallow[~shallow["rank"].isin(worst["rank"])]
        if not rest.empty:
            median = rest.groupby("module", as_index=False).latency_ms.median()
            shown = pd.concat([shown, median.assign(label=f"median of the other {rest['rank'].nunique()} ranks")])

        def per_rank():
            fig = px.bar(shown, x="module", y="latency_ms", color="label", barmode="group")
            fig.update_yaxes(title="fwd latency (ms)")
            return fig.update_layout(title="Top-level modules' fwd latency per rank", height=charts.HEIGHT)

        st.plotly_chart(
            state.memo(f"flops.{sel.run_id}.per_rank", state.tables_version(sel, version, ("flops",)), per_rank)
        )

        st.subheader("Detailed profile")
        tables.dataframe(detailed_table(tree), hide_index=True)

    state.live(sel, body)


st.title("FLOPS")
flops_page()
