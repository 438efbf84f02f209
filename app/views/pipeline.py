"""Pipeline: one step's timeline per stage (forward and backward per micro-batch, the waits for the
neighbour stages, the gaps are the bubbles) and each stage's bubble fraction over steps against
1F1B's ideal (p - 1) / (m + p - 1) (collector.data.pipeline)."""

import streamlit as st

from app import charts, queries, state, tables


def pipeline_page() -> None:
    sel = state.selection()

    def body(version: str) -> None:
        bubbles = queries.pipe_bubbles(sel.data_dir, sel.run_id, version)
        if bubbles.empty:
            state.missing_data(
                sel, "pipe", "No pipeline records in this run: it was not trained with `trainer.pipe.PipelineModule`."
            )
            return
        stages, m = int(bubbles.stages.max()), int(bubbles.micro_batches.max())
        v = int(bubbles.virtual_stages.max())
        schedule = "1F1B" if v == 1 else f"interleaved 1F1B, {v} virtual stages"
        ideal = float(bubbles.ideal_fraction.iloc[-1])
        steps = sorted(bubbles.step.unique())
        pipelines = sorted(bubbles.data_rank.unique())
        left, right = st.columns(2)
        step = left.select_slider("Step", steps, value=steps[-1])
        replica = right.selectbox("Pipeline (data-parallel replica)", pipelines) if len(pipelines) > 1 else 0
        moved = state.tables_version(sel, version, ("pipe",))
        line = queries.pipe_timeline(sel.data_dir, sel.run_id, int(step), int(replica), version)
        st.plotly_chart(
            state.memo(
                f"pipe.{sel.run_id}.{step}.{replica}",
                moved,
                lambda: charts.pipeline_timeline(line, f"Step {step}: {stages} stages, {m} micro-batches"),
            )
        )
        per_stage = bubbles[bubbles.data_rank == replica].assign(
            stage=lambda d: "stage " + d.stage.astype(str), bubble_pct=lambda d: 100 * d.bubble_fraction
        )
        st.plotly_chart(
            state.memo(
                f"pipe.{sel.run_id}.{replica}.bubbles",
                moved,
                lambda: charts.lines(
                    per_stage,
                    "step",
                    "bubble_pct",
                    "stage",
                    f"Bubble fraction per stage (ideal for {schedule}: {100 * ideal:.0f}%)",
                    y_title="% of the step idle",
                ),
            )
        )
        table = bubbles.groupby("stage", as_index=False)[["busy_ms", "bubble_ms", "bubble_fraction", "layers"]].median()
        table["ms per micro-batch"] = table.busy_ms / m
        tables.dataframe(table, hide_index=True)

    state.live(sel, body)


st.title("Pipeline")
pipeline_page()
