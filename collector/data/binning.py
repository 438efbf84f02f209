"""Per-rank results cut down to what a chart can show at 1,024 or 8,192 ranks.

A heatmap with a row per rank stops being readable (and drawable) long before a
thousand rows; a bar or a legend entry per rank likewise. Two pure functions of query
frames keep every chart to a few dozen rows whatever the world size:

- ``bin_ranks`` groups ranks into at most ``max_rows`` bins: one per rank while they
  fit, else one per host (the unit an operator can drain), else contiguous rank ranges.
  ``bin_grid`` then reduces a (rank, step) grid to (bin, step) cells holding the bin's
  max and p95 and the rank behind the max -- a straggler stays visible in its bin's
  max, the p95 tells one bad rank from a bad host -- and orders the bins worst first.
- ``top_k`` keeps the k worst ranks of a per-rank frame and summarises the rest as a
  median row, so bars and legends name the ranks that matter and still show "normal".

Ties are broken by rank so the same data always gives the same picture.
"""

from __future__ import annotations

import math

import pandas as pd

MAX_ROWS = 64  # heatmap rows: readable at 12 px a row, far below what a browser struggles with
MAX_STEPS = 200  # heatmap columns: beyond this, steps are binned too (a column per range of steps)
TOP_K = 8


def rank_label(rank: int, host: str | None = None) -> str:
    return f"{host} · rank {rank}" if host else f"rank {rank}"


def bin_ranks(ranks: pd.DataFrame, max_rows: int = MAX_ROWS) -> pd.DataFrame:
    """(rank, bin, label, kind) for every rank in ``ranks`` (columns rank and, optionally,
    host). ``kind`` is "rank", "host" or "range"; bins are numbered in rank order."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if ranks.empty:
        return pd.DataFrame({"rank": [], "bin": [], "label": [], "kind": []})
    df = ranks[["rank"] + (["host"] if "host" in ranks else [])].drop_duplicates("rank").sort_values("rank")
    hosts = df.host.fillna("?") if "host" in df else None
    n_hosts = 0 if hosts is None else hosts.nunique()
    if len(df) <= max_rows:
        labels = [
            rank_label(int(r), h if n_hosts > 1 else None) for r, h in zip(df["rank"], hosts if n_hosts else df["rank"])
        ]
        if n_hosts > 1:  # grouped by host: neighbours in the picture are neighbours in the machine room
            order = df.assign(h=hosts).sort_values(["h", "rank"]).index
            df = df.loc[order]
            labels = [rank_label(int(r), h) for r, h in zip(df["rank"], hosts.loc[order])]
        return pd.DataFrame({"rank": df["rank"].to_numpy(), "bin": range(len(df)), "label": labels, "kind": "rank"})
    if 1 < n_hosts <= max_rows:
        first = df.assign(h=hosts).groupby("h")["rank"].agg(["min", "max", "count"]).sort_values("min")
        number = {h: i for i, h in enumerate(first.index)}
        label = {
            h: f"{h} (ranks {r['min']}–{r['max']})" if r["count"] > 1 else rank_label(r["min"], h)
            for h, r in first.iterrows()
        }
        return pd.DataFrame(
            {
                "rank": df["rank"].to_numpy(),
                "bin": hosts.map(number).to_numpy(),
                "label": hosts.map(label).to_numpy(),
                "kind": "host",
            }
        )
    width = math.ceil(len(df) / max_rows)
    position = pd.Series(range(len(df)), index=df.index) // width
    lo = df["rank"].groupby(position).transform("min")
    hi = df["rank"].groupby(position).transform("max")
    return pd.DataFrame(
        {
            "rank": df["rank"].to_numpy(),
            "bin": position.to_numpy(),
            "label": [f"ranks {a}–{b}" for a, b in zip(lo, hi)],
            "kind": "range",
        }
    )


def step_width(steps: pd.Series, max_steps: int = MAX_STEPS) -> int:
    """Steps per heatmap column so that at most ``max_steps`` columns are drawn."""
    if steps.empty:
        return 1
    return max(1, math.ceil((int(steps.max()) - int(steps.min()) + 1) / max_steps))


def bin_grid(grid: pd.DataFrame, bins: pd.DataFrame, value: str, max_steps: int = MAX_STEPS) -> pd.DataFrame:
    """(bin, label, step, max, p95, worst_rank, ranks) per bin and step of ``grid``'s
    ``value`` (columns rank, step, value), bins ordered worst first (highest max over all
    steps), as a column ``order``. Beyond ``max_steps`` steps, ``step`` is the first step of
    a range of ``step_width`` steps, and max/p95 are over the bin's ranks and those steps."""
    if grid.empty:
        return pd.DataFrame(columns=["bin", "label", "step", "max", "p95", "worst_rank", "ranks", "order"])
    width = step_width(grid.step, max_steps)
    df = grid[["rank", "step", value]].merge(bins[["rank", "bin", "label"]], on="rank")
    if width > 1:
        first = int(grid.step.min())
        df["step"] = first + (df.step - first) // width * width
    df = df.sort_values([value, "rank"], ascending=[False, True], kind="stable")
    per = df.groupby(["bin", "label", "step"], sort=False)
    out = per.agg(max=(value, "first"), worst_rank=("rank", "first"), ranks=("rank", "nunique")).reset_index()
    out["p95"] = per[value].quantile(0.95).to_numpy()
    worst = out.groupby("bin")["max"].max().rename("worst")
    out = out.join(worst, on="bin").sort_values(["worst", "bin"], ascending=[False, True], kind="stable")
    out["order"] = out.bin.map({b: i for i, b in enumerate(out.bin.drop_duplicates())})
    return out.drop(columns="worst").sort_values(["order", "step"]).reset_index(drop=True)


def top_k(per_rank: pd.DataFrame, value: str, k: int = TOP_K, *, others: bool = True) -> pd.DataFrame:
    """The ``k`` rows of ``per_rank`` (one per rank) with the highest ``value``, worst first,
    with a ``label``; plus, when ranks were left out and ``others``, a row labelled
    "median of the other N ranks" holding the median of every numeric column."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    ordered = per_rank.sort_values([value, "rank"], ascending=[False, True], kind="stable")
    top = ordered.head(k).assign(label=lambda f: [rank_label(int(r)) for r in f["rank"]])
    rest = ordered.iloc[k:]
    if not others or rest.empty:
        return top.reset_index(drop=True)
    median = rest.median(numeric_only=True).to_frame().T.assign(label=f"median of the other {len(rest)} ranks")
    median["rank"] = -1
    return pd.concat([top, median[top.columns]], ignore_index=True)


def cell_at(binned: pd.DataFrame, label: str, step: int) -> tuple[int, int] | None:
    """(rank, step) behind a click on a bin_grid heatmap at (``step``, the row ``label``): the
    cell's worst rank; off the grid's steps (a row's handle, app.charts.binned_heatmap) the row's
    worst cell. None for a label that is no row."""
    row = binned[binned.label == label]
    hit = row[row.step == step]
    if hit.empty:
        hit = row.nlargest(1, "max")
    return None if hit.empty else (int(hit.worst_rank.iloc[0]), int(hit.step.iloc[0]))
