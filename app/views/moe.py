"""MoE: tokens routed to each expert per step (summed over ranks) and tokens dropped
for exceeding the expert's capacity."""

import streamlit as st

from app import charts, queries, state, tables


def moe_page() -> None:
    sel = state.selection()

    def body(version: str) -> None:
        load = queries.moe_load(sel.data_dir, sel.run_id, version)
        if load.empty:
            state.missing_data(sel, "moe", "No MoE records in this run: the model has no `trainer.moe.MoE` layers.")
            return
        layers = sorted(load.layer.unique())
        layer = st.selectbox("Layer", layers, format_func=lambda n: f"layer {n}")
        rows = load[load.layer == layer]
        key, moved = f"moe.{sel.run_id}.{layer}", state.tables_version(sel, version, ("moe",))
        st.plotly_chart(
            state.memo(
                f"{key}.load",
                moved,
                lambda: charts.moe_heatmap(rows, f"Expert load, layer {layer} (tokens per step)"),
            )
        )
        dropped = rows.groupby("step", as_index=False).dropped.sum()
        st.plotly_chart(
            state.memo(
                f"{key}.dropped",
                moved,
                lambda: charts.lines(
                    dropped, "step", "dropped", None, "Dropped tokens per step", y_title="tokens dropped"
                ),
            )
        )
        totals = rows.groupby("expert", as_index=False)[["tokens", "dropped"]].sum()
        totals["share of tokens"] = totals.tokens / totals.tokens.sum()
        tables.dataframe(
            totals,
            hide_index=True,
            column_config={
                "share of tokens": st.column_config.ProgressColumn(format="percent", min_value=0, max_value=1),
            },
        )

    state.live(sel, body)


st.title("MoE")
moe_page()
