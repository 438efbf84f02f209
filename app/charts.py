"""Plotly figure builders shared by the pages. Each takes a query result and
returns a figure; none runs a query."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from collector.data import binning

HEIGHT = 320


def _tidy(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(title=title, height=height, margin=dict(l=10, r=10, t=40, b=10), legend_title_text="")
    return fig


def lines(
    df: pd.DataFrame,
    x: str,
    y: str,
    color: str | None,
    title: str,
    *,
    y_title: str | None = None,
    x_title: str | None = None,
    log_y: bool = False,
    hover: dict | None = None,
) -> go.Figure:
    # What px.line(df, x, y, color, markers=len(df) < 60, hover_data=hover, render_mode="svg") draws,
    # built from graph objects: a trace per colour value in order of appearance, px's hover text.
    # px spends ~40-80 ms on a chart whatever its size, this ~1 ms a trace: a live page rebuilds
    # its line charts at every refresh. SVG, not plotly's WebGL (its pick above 1,000 points): a
    # browser without a GPU (headless, remote desktops) renders WebGL in software at ~1 s per
    # chart; SVG draws 10k-point lines at once.
    mode = "lines+markers" if len(df) < 60 else "lines"
    extra = [name for name, shown in (hover or {}).items() if shown and name in df.columns]
    groups = [(None, df)] if color is None else list(df.groupby(color, sort=False, dropna=False))
    fig = go.Figure()
    for value, rows in groups:
        head = [] if color is None else [f"{color}={value}"]
        tail = [f"{name}=%{{customdata[{i}]}}" for i, name in enumerate(extra)]
        fig.add_trace(
            go.Scatter(
                x=rows[x].to_numpy(),
                y=rows[y].to_numpy(),
                mode=mode,
                name="" if color is None else str(value),
                legendgroup="" if color is None else str(value),
                showlegend=color is not None,
                customdata=rows[extra].to_numpy() if extra else None,
                hovertemplate="<br>".join([*head, f"{x}=%{{x}}", f"{y}=%{{y}}", *tail]) + "<extra></extra>",
            )
        )
    fig.update_yaxes(title=y_title or y, type="log" if log_y else None)
    fig.update_xaxes(title=x_title or x)
    return _tidy(fig, title) if color is None else legend_below(_tidy(fig, title))


BYTE_UNITS = (("bytes", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40))


def byte_unit(values) -> tuple[str, int]:
    """The unit a byte axis reads in, chosen from the data's largest magnitude: 441 KB reads
    "430.7 KiB", not a flat line at 0.0004 GiB."""
    top = float(np.nanmax(np.abs(np.asarray(values, dtype=float)))) if len(values) else 0.0
    unit = BYTE_UNITS[0]
    for name, size in BYTE_UNITS:
        if np.isfinite(top) and top >= size:
            unit = (name, size)
    return unit


def memory_lines(rows: pd.DataFrame, title: str) -> go.Figure:
    """Bytes per series over steps (queries.memory_lines rows), in the unit that fits them, on an
    axis from 0 that holds every value: a constant buffer draws as a level line, not at 0."""
    unit, size = byte_unit(rows["bytes"])
    fig = lines(rows.assign(**{unit: rows["bytes"] / size}), "step", unit, "series", title, y_title=unit)
    top = float((rows["bytes"] / size).max()) if len(rows) else 0.0
    fig.update_yaxes(rangemode="tozero", range=[0, top * 1.1 if top > 0 else 1], tickformat=",.4~g")
    return fig


def power_of_two_ticks(values, most: int = 10) -> tuple[list[float], list[str]]:
    """Tick values and labels (``2^24``) for a log2 axis over ``values``: one per power of two
    between their min and max (every k-th beyond ``most``), each exact."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if not len(v):
        return [], []
    lo, hi = int(np.floor(np.log2(v.min()))), int(np.ceil(np.log2(v.max())))
    step = max(1, -(-(hi - lo + 1) // most))
    exps = list(range(lo, hi + 1, step))
    return [float(2.0**e) for e in exps], [f"2^{e}" for e in exps]


def loss_scale(df: pd.DataFrame) -> go.Figure:
    """The scale as a step line (log2 axis) with a red marker at every overflow."""
    fig = go.Figure(
        go.Scatter(
            x=df.step,
            y=df.scale,
            mode="lines",
            line_shape="hv",
            name="loss scale",
            hovertemplate="step %{x}: scale %{y:,.0f}<extra></extra>",
        )
    )
    over = df[df.overflow]
    fig.add_trace(
        go.Scatter(
            x=over.step,
            y=over.scale,
            mode="markers",
            name="overflow",
            marker=dict(color="red", symbol="x", size=10),
            customdata=over.bad_params,
            hovertemplate="step %{x}: overflow, scale → %{y:,.0f}<br>%{customdata}<extra></extra>",
        )
    )
    # a tick on each power of two (a log axis' dtick of log10(2) lands on 16,777,220, not 2^24)
    tickvals, ticktext = power_of_two_ticks(df.scale)
    fig.update_yaxes(type="log", tickmode="array", tickvals=tickvals, ticktext=ticktext, title="scale (log2)")
    return _tidy(fig, "Loss scale (× = overflow, step skipped)")


def leaf_timers(names) -> list[str]:
    """The timers that do not contain others: DeepSpeed's ``bwd`` is ``bwd_inner`` + ``bwd_allreduce``
    (a timer X with X_* beside it holds them), so stacking all three would count the backward twice."""
    names = list(names)
    return [n for n in names if not any(o != n and o.startswith(n + "_") for o in names)]


def step_breakdown(mean: pd.DataFrame) -> go.Figure:
    """Mean time per timer per rank (queries.step_breakdown), stacked: where each rank's step
    goes (timers that hold others left out, ``leaf_timers``). Beyond TOP_K ranks, the slowest
    ranks and the median of the rest."""
    wide = mean.pivot(index="rank", columns="name", values="dur_ms").fillna(0)
    wide = wide[leaf_timers(wide.columns)]
    names = list(wide.columns)
    per_rank = wide.assign(total=wide.sum(axis=1)).reset_index()
    many = len(per_rank) > binning.TOP_K
    shown = binning.top_k(per_rank, "total") if many else per_rank.assign(label="rank " + per_rank["rank"].astype(str))
    # graph objects, not px.bar (~100 ms a chart): a live Overview rebuilds it at every refresh
    fig = go.Figure(
        [
            go.Bar(
                x=shown["label"].to_numpy(),
                y=shown[name].to_numpy(),
                name=name,
                legendgroup=name,
                hovertemplate=f"name={name}<br>label=%{{x}}<br>dur_ms=%{{y}}<extra></extra>",
            )
            for name in names
        ]
    )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="mean ms per step")
    fig.update_xaxes(title="", type="category")
    title = "Step time breakdown per rank"
    if many:
        title += f" (the {binning.TOP_K} slowest of {len(per_rank):,} and the median of the rest)"
    return _tidy(fig, title)


def legend_below(fig: go.Figure) -> go.Figure:
    """The legend in a row under the plot: at the right, beside a half-width column's plot, names
    like 'all_reduce expected (p10-p90)' took half the chart."""
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0))
    fig.update_layout(height=HEIGHT + 40, margin=dict(b=60))
    return fig


def size_label(n: float) -> str:
    """A message size in the byte unit that fits it: 4 bytes, 64 KiB, 1.5 MiB."""
    unit, size = next(((u, s) for u, s in reversed(BYTE_UNITS) if n >= s), BYTE_UNITS[0])
    return f"{n / size:.3g} {unit}"


def size_axis(fig: go.Figure, sizes) -> None:
    """Message sizes as ordered categories, one per size seen: on a log axis one 4-byte all_reduce
    (a loss or overflow flag) pushed every bucket-sized message into a strip at the right."""
    order = [size_label(n) for n in sorted(set(sizes))]
    fig.update_xaxes(title="message size", type="category", categoryorder="array", categoryarray=order)


def busbw_vs_size(df: pd.DataFrame) -> go.Figure:
    df = df.sort_values("bytes").assign(size=lambda d: d.bytes.map(size_label))
    fig = px.line(df, x="size", y="busbw_gbs", color="op", markers=True, hover_data={"count": True, "bytes": ":,"})
    size_axis(fig, df.bytes)
    fig.update_yaxes(title="busbw (GB/s)")
    return legend_below(_tidy(fig, "Bus bandwidth vs message size"))


def busbw_envelope(band: pd.DataFrame, marks: pd.DataFrame) -> go.Figure:
    """Median busbw per message size and op, its expected envelope (10th-90th percentile of the
    healthy steps) as a band, and the sizes a slow link pushed under it as red crosses."""
    fig = go.Figure()
    palette = px.colors.qualitative.Plotly
    for i, (op, rows) in enumerate(band.sort_values("bytes").groupby("op", sort=True)):
        colour = palette[i % len(palette)]
        x = rows.bytes.map(size_label).tolist()
        fig.add_trace(
            go.Scatter(
                x=x + x[::-1],
                y=rows.high.tolist() + rows.low.tolist()[::-1],
                fill="toself",
                fillcolor=colour,
                opacity=0.2,
                line=dict(width=0),
                hoverinfo="skip",
                name=f"{op} expected (p10-p90)",
            )
        )
        fig.add_trace(go.Scatter(x=x, y=rows.mid, mode="lines+markers", line=dict(color=colour), name=op))
    if not marks.empty:
        fig.add_trace(
            go.Scatter(
                x=marks.bytes.map(size_label),
                y=marks.busbw_gbs,
                mode="markers",
                marker=dict(symbol="x", size=12, color="red"),
                name="slow link",
                text=[f"steps {s}: {t}" for s, t in zip(marks.steps, marks.text, strict=True)],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    size_axis(fig, pd.concat([band.bytes, marks.bytes]) if not marks.empty else band.bytes)
    fig.update_yaxes(title="busbw (GB/s)")
    return legend_below(_tidy(fig, "Bus bandwidth vs message size, expected band"))


def link_health(grid: pd.DataFrame) -> go.Figure:
    """Hosts x steps, each cell the transfer ratio (measured over expected) of the cross-host groups
    through that host's link: 1 is at speed; the worst hosts on top (findings.links.link_health_grid)."""
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(dtype=float),
            x=[int(c) for c in grid.columns],
            y=[str(i) for i in grid.index],
            zmin=1.0,
            zmax=max(2.0, float(np.nanmax(grid.to_numpy(dtype=float)))),
            colorscale="Reds",
            colorbar=dict(title="x expected"),
            hovertemplate="%{y}, step %{x}: transfer %{z:.2f}x expected<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", title="host")
    fig.update_xaxes(title="step")
    return _tidy(
        fig, "Link health per host: cross-host transfer over expected", height=max(HEIGHT, 14 * len(grid) + 80)
    )


def colour_ceiling(grid: pd.DataFrame) -> float | None:
    """The top of a rank x step heatmap's colour scale: the largest value after the first step, when
    the first step (warm-up: allocator, first collectives, often 5-10x a later step) is larger, so
    one warm-up column does not wash every later straggler out to the bottom colour. None: auto."""
    if grid.shape[1] < 3:
        return None
    later = np.nanmax(grid.iloc[:, 1:].to_numpy(dtype=float)) if grid.iloc[:, 1:].notna().any().any() else np.nan
    first = np.nanmax(grid.iloc[:, 0].to_numpy(dtype=float)) if grid.iloc[:, 0].notna().any() else np.nan
    return float(later) if np.isfinite(later) and np.isfinite(first) and first > later > 0 else None


def _colour_range(grid: pd.DataFrame) -> dict:
    top = colour_ceiling(grid)
    if top is None:
        return {}
    bottom = float(np.nanmin(grid.to_numpy(dtype=float)))
    return dict(zmin=min(bottom, top), zmax=top)


ROW_LABEL_FONT = 10  # px: a heatmap row is 14 px tall at the least, so every row's label fits
MAX_ROW_LABELS = binning.MAX_ROWS
WORST_ROWS_LABELLED = binning.TOP_K


def row_ticks(grid: pd.DataFrame, labels: list[str], most: int = MAX_ROW_LABELS) -> list[str]:
    """Which rows of a heatmap get a label: every row while they fit (``most``), else the
    WORST_ROWS_LABELLED rows with the highest value and evenly spaced others; the worst rows are
    always named (plotly's own category ticks skip every other row, the worst one included)."""
    if len(labels) <= most:
        return list(labels)
    peak = np.nan_to_num(np.nanmax(grid.to_numpy(dtype=float), axis=1, initial=-np.inf), nan=-np.inf)
    keep = set(np.argsort(-peak, kind="stable")[:WORST_ROWS_LABELLED].tolist())
    spacing = max(1, len(labels) // max(1, most - len(keep)))
    keep |= set(range(0, len(labels), spacing))
    return [labels[i] for i in sorted(keep)]


def _label_rows(fig: go.Figure, grid: pd.DataFrame, labels: list[str]) -> None:
    shown = row_ticks(grid, labels)
    fig.update_yaxes(
        type="category",
        autorange="reversed",
        tickmode="array",
        tickvals=shown,
        ticktext=shown,
        tickfont=dict(size=ROW_LABEL_FONT),
    )


# A clickable heatmap carries one invisible marker per cell up to this many cells; SVG
# draws each marker as a node, and 10k of them held the Stragglers page ~3 s at 1,024 ranks.
MAX_CLICK_CELLS = 2_500


def heatmap(
    df: pd.DataFrame,
    z: str,
    title: str,
    *,
    y_labels: dict[int, str] | None = None,
    colorbar: str = "ms",
    clickable: bool = False,
) -> go.Figure:
    """Rank x step grid of ``z``; rows follow ``y_labels``' order (e.g. grouped by host).

    Plotly reports no selection on heatmap cells, so a clickable heatmap carries an
    invisible marker on every cell: clicking a cell selects its marker (x=step, y=label). Beyond
    MAX_CLICK_CELLS cells (a live run's steps keep coming: 4 ranks x 2,500 steps), one handle per
    row right of the map instead (x one column past the last step), as ``binned_heatmap`` has."""
    grid = df.pivot(index="rank", columns="step", values=z).sort_index()
    if y_labels:
        grid = grid.reindex([r for r in y_labels if r in grid.index] + [r for r in grid.index if r not in y_labels])
    labels = [(y_labels or {}).get(r, f"rank {r}") for r in grid.index]
    fig = go.Figure(
        go.Heatmap(
            z=grid.values,
            x=list(grid.columns),
            y=labels,
            colorscale="Viridis",
            colorbar=dict(title=colorbar),
            hovertemplate="%{y}, step %{x}: %{z:.2f} " + colorbar + "<extra></extra>",
            **_colour_range(grid),
        )
    )
    if clickable and grid.size > MAX_CLICK_CELLS:
        steps = list(grid.columns)
        fig.add_trace(
            go.Scatter(
                x=[steps[-1] + (steps[-1] - steps[-2] if len(steps) > 1 else 1)] * len(labels),
                y=labels,
                mode="markers",
                marker=dict(symbol="triangle-left", size=9, color="#888"),
                showlegend=False,
                hovertemplate="%{y}: click to list the collectives of its worst step<extra></extra>",
            )
        )
    elif clickable:
        cells = grid.stack().reset_index()
        fig.add_trace(
            go.Scatter(
                x=cells.step,
                y=[labels[grid.index.get_loc(r)] for r in cells["rank"]],
                mode="markers",
                marker=dict(symbol="square", size=12, opacity=0),
                showlegend=False,
                hovertemplate="%{y}, step %{x}: click to list its collectives<extra></extra>",
            )
        )
    _label_rows(fig, grid, labels)
    fig.update_xaxes(title="step")
    row_px = 40 if len(labels) <= 16 else 14  # a bin opened at 8,192 ranks still fits a screen or two
    return _tidy(fig, title, height=max(HEIGHT, row_px * len(labels) + 120))


def last_rank_bars(df: pd.DataFrame) -> go.Figure:
    """Per op, the few ranks that arrive last most often (binning.top_k rows: label, op, share)."""
    shown = df.assign(percent=100 * df.share)
    fig = px.bar(
        shown, x="label", y="percent", color="op", barmode="group", hover_data={"n_last": True, "mean_lead_ms": ":.1f"}
    )
    fig.update_yaxes(title="% of collectives arriving last")
    fig.update_xaxes(title="", type="category")
    return _tidy(fig, "Ranks arriving last most often, per collective")


def wavefront(wave: pd.DataFrame) -> go.Figure:
    """Per rank (or rank range), the last collective seq entered and completed in the group whose
    ranks are furthest apart (queries.wavefront rows): a stuck collective is where "entered" runs
    ahead of "completed", and the ranks missing from it lag behind both."""
    per_group = wave.groupby("group_name").agg(entered=("max_entered", "max"), completed=("min_completed", "min"))
    name = (per_group.entered - per_group.completed).idxmax()
    group = wave[wave.group_name == name]
    ranges = zip(group.first_rank, group.last_rank, strict=True)
    labels = [f"rank {lo}" if lo == hi else f"ranks {lo}–{hi}" for lo, hi in ranges]
    # Seqs counted from the lowest one shown: 19,208 against 19,213 drawn from 0 look the same.
    # (from one below the lowest, so the lowest bar still shows)
    seqs = pd.concat([group.max_entered, group.min_completed]).dropna()
    base = int(seqs.min()) - 1 if len(seqs) else 0
    fig = go.Figure(
        [
            go.Bar(
                x=labels,
                y=seqs_above - base,
                customdata=seqs_above,
                name=name_of,
                hovertemplate=f"%{{x}}: {name_of} seq %{{customdata:,}}<extra></extra>",
            )
            for seqs_above, name_of in ((group.max_entered, "last entered"), (group.min_completed, "last completed"))
        ]
    )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="", type="category")
    span = int(seqs.max()) - base if len(seqs) else 1
    fig.update_yaxes(title=f"collective seq in {name} − {base:,}", tickformat=",d", dtick=1 if span <= 10 else None)
    return _tidy(fig, f"Wavefront: how far each rank got in {name}")


def binned_heatmap(binned: pd.DataFrame, title: str, *, colorbar: str = "ms", clickable: bool = False) -> go.Figure:
    """Bin x step grid (binning.bin_grid): colour is the bin's max, hover adds its p95 and the
    rank behind the max; rows worst first. Binned steps are labelled by their first step.

    Clickable as ``heatmap`` is, one marker per cell, while the grid has at most MAX_CLICK_CELLS;
    beyond, one handle per row right of the map (x one column past the last step): clicking it
    selects (that x, the row's label), which the page opens at the bin's worst cell."""
    grid = binned.pivot(index="order", columns="step", values="max").sort_index()
    p95 = binned.pivot(index="order", columns="step", values="p95").reindex_like(grid)
    worst = binned.pivot(index="order", columns="step", values="worst_rank").reindex_like(grid)
    labels = binned.drop_duplicates("order").set_index("order").label.reindex(grid.index).tolist()
    fig = go.Figure(
        go.Heatmap(
            z=grid.values,
            x=list(grid.columns),
            y=labels,
            customdata=np.dstack([p95.values, worst.values]),
            colorscale="Viridis",
            colorbar=dict(title=colorbar, len=1, lenmode="fraction"),
            hovertemplate="%{y}, step %{x}: max %{z:.2f} "
            + colorbar
            + " (rank %{customdata[1]:.0f}), p95 %{customdata[0]:.2f}<extra></extra>",
            **_colour_range(grid),
        )
    )
    if clickable and grid.size <= MAX_CLICK_CELLS:
        cells = binned[["order", "step"]]
        fig.add_trace(
            go.Scatter(
                x=cells.step,
                y=[labels[grid.index.get_loc(o)] for o in cells.order],
                mode="markers",
                marker=dict(symbol="square", size=8, opacity=0),
                showlegend=False,
                hovertemplate="%{y}, step %{x}: click to open this bin<extra></extra>",
            )
        )
    elif clickable:
        steps = list(grid.columns)
        past_last = steps[-1] + (steps[-1] - steps[-2] if len(steps) > 1 else 1)
        fig.add_trace(
            go.Scatter(
                x=[past_last] * len(labels),
                y=labels,
                mode="markers",
                marker=dict(symbol="triangle-left", size=9, color="#888"),
                showlegend=False,
                hovertemplate="%{y}: click to open this bin at its worst cell<extra></extra>",
            )
        )
    _label_rows(fig, grid, labels)
    fig.update_xaxes(title="step")
    return _tidy(fig, title, height=max(HEIGHT, 14 * len(labels) + 120))


def _branch_values(tree: pd.DataFrame, column: str) -> str:
    """'total' when every parent covers its children (the profiler's normal output), else
    'remainder' so inconsistent measurements still draw instead of vanishing."""
    children = tree[tree.parent_id != ""].groupby("parent_id")[column].sum()
    own = tree.set_index("id")[column].reindex(children.index)
    return "total" if (own.fillna(0) + 1e-9 >= children).all() else "remainder"


def module_tree(df: pd.DataFrame, kind: str, size_by: str) -> go.Figure:
    """The profiler's module tree as an icicle / treemap / sunburst, coloured by achieved TFLOPS."""
    tree = df.assign(
        id=df.module.replace("", "(model)"),
        parent_id=df.parent.fillna("").replace("", "(model)").where(df.module != "", ""),
        latency_ms=df.latency_ns / 1e6,
        tflops=df.flops / df.latency_ns.where(df.latency_ns > 0) / 1e3,
    )  # flops/ns = GFLOPS
    builder = {"icicle": go.Icicle, "treemap": go.Treemap, "sunburst": go.Sunburst}[kind]
    fig = go.Figure(
        builder(
            ids=tree.id,
            labels=tree.id.str.rsplit(".", n=1).str[-1] + " (" + tree.module_type.fillna("") + ")",
            parents=tree.parent_id,
            values=tree[size_by],
            branchvalues=_branch_values(tree, size_by),
            marker=dict(
                colors=tree.tflops.fillna(0), colorscale="Viridis", showscale=True, colorbar=dict(title="TFLOPS")
            ),
            customdata=tree[["flops", "latency_ms", "tflops"]].values,
            hovertemplate="%{id}<br>flops %{customdata[0]:.3s}<br>fwd latency %{customdata[1]:.2f} ms"
            "<br>achieved %{customdata[2]:.3f} TFLOPS<extra></extra>",
        )
    )
    return _tidy(fig, f"Module tree sized by {size_by}, coloured by achieved FLOPS", height=480)


def moe_heatmap(df: pd.DataFrame, title: str) -> go.Figure:
    grid = df.pivot(index="expert", columns="step", values="tokens").sort_index()
    fig = go.Figure(
        go.Heatmap(
            z=grid.values,
            x=list(grid.columns),
            y=[f"expert {e}" for e in grid.index],
            colorscale="Viridis",
            colorbar=dict(title="tokens"),
        )
    )
    fig.update_yaxes(type="category", autorange="reversed")
    fig.update_xaxes(title="step")
    return _tidy(fig, title)


ID_COLUMNS = ("run_id", "name", "run", "host", "group_name")
X_PREFERRED = ("step", "time_ns", "ts_ns", "samples", "seq", "bytes", "rank", "expert", "depth")


def custom_defaults(df: pd.DataFrame) -> tuple[str, str, str, str | None]:
    """(kind, x, y, colour) the SQL console's chart opens with: a line over a step-like column,
    else bars over the first label column (never the run id while one run is shown), y the last
    numeric column that is not x, coloured by a label column with a few values."""
    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]
    labels = [c for c in df.columns if c not in numeric]
    ordered = [c for c in X_PREFERRED if c in df.columns]
    if ordered:
        x = ordered[0]
    else:
        useful = [c for c in labels if c not in ID_COLUMNS or df[c].nunique() > 1]
        x = (useful or labels or list(df.columns))[0]
    ys = [c for c in numeric if c != x and c not in ("rank", "step", "seq")] or [c for c in numeric if c != x]
    y = ys[-1] if ys else x
    kind = "line" if x in ("step", "time_ns", "ts_ns", "samples", "seq") else "bar"
    colours = [c for c in df.columns if c not in (x, y) and c not in numeric and 1 < df[c].nunique() <= 20]
    if kind == "line" and not colours and "rank" in df.columns and x != "rank" and 1 < df["rank"].nunique() <= 20:
        colours = ["rank"]
    return kind, x, y, (colours[0] if colours else None)


def custom(df: pd.DataFrame, kind: str, x: str, y: str, color: str | None) -> go.Figure:
    """The SQL console's chart builder."""
    builder = {"line": px.line, "bar": px.bar, "scatter": px.scatter}[kind]
    shown = df.assign(**{color: df[color].astype(str)}) if color else df  # a rank colours by category
    fig = builder(shown.sort_values(x) if kind == "line" else shown, x=x, y=y, color=color)
    if kind == "bar":
        fig.update_layout(barmode="group")  # side by side: stacked busbw of two ops means nothing
        if not pd.api.types.is_numeric_dtype(df[x]):
            fig.update_xaxes(type="category")
    return _tidy(fig, f"{y} by {x}")


PIPE_KINDS = {"fwd": "forward", "bwd": "backward", "recv_act": "wait: activation", "recv_grad": "wait: gradient"}


def pipeline_timeline(line: pd.DataFrame, title: str) -> go.Figure:
    """Stages x time for one step: forward and backward per micro-batch (coloured by micro-batch, backward
    hatched), the waits for a neighbour in grey; the gaps are the bubbles."""
    fig = go.Figure()
    palette = px.colors.qualitative.Plotly
    for kind, rows in line[line.kind.isin(list(PIPE_KINDS))].groupby("kind", sort=False):
        waiting = kind.startswith("recv")
        fig.add_trace(
            go.Bar(
                name=PIPE_KINDS[kind],
                y=[f"stage {s}" for s in rows.stage],
                x=rows.end_ms - rows.start_ms,
                base=rows.start_ms,
                orientation="h",
                marker=dict(
                    color="lightgrey" if waiting else [palette[mb % len(palette)] for mb in rows.micro_batch],
                    pattern_shape="/" if kind == "bwd" else "",
                ),
                text=None if waiting else [str(mb) for mb in rows.micro_batch],
                customdata=rows.micro_batch,
                hovertemplate=f"{PIPE_KINDS[kind]}, micro-batch %{{customdata}}: at %{{base:.1f}} ms, "
                "%{x:.1f} ms<extra></extra>",
            )
        )
    fig.update_layout(barmode="overlay")
    fig.update_yaxes(type="category", autorange="reversed")
    fig.update_xaxes(title="ms from the step's first event")
    return _tidy(fig, title)
