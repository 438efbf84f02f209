"""The OSDI'25 what-if study's trace format (github.com/ByteDance-Seed/StragglerAnalysis):
``trace-X.parquet``, one row per op (dp_rank, stage, rank, step, optype, start_ts, duration,
seq_id, mc, gmc, mb_id; seconds from the step's start), with ``meta-X.yaml`` beside it (dp_size,
pp_size, tp_size, dsp_size, vpp_size, world_size).

The trace holds one worker per (dp_rank, stage) (its TP ranks collapsed); each becomes a rank of
the run, numbered in the trace's rank order (run rank i = the i-th lowest trace rank), so the
run's world size is the number of workers. Steps keep their numbers and are laid end to end
(the trace's clock restarts at every step). Then:

- compute ops (forward/backward compute per micro-batch, gc, optimizer) become ``timers`` named
  by their op type, and forward/backward compute also ``pipe`` rows (kind fwd/bwd, micro_batch,
  stage, data_rank = dp_rank, stages = pp_size): what keeps each worker's dp_rank and stage;
- pipeline sends/receives and collectives become ``comm`` rows (``log_name`` = op type) in their
  groups: a transfer between neighbour stages in ``p2p[src->dst]`` (the convention of
  collector/rank/recorder.py; ``peer`` the other worker, ``?`` where the trace has none),
  ``dp.stage<s>`` for the params all-gather and grads reduce-scatter, ``tp.<rank>`` for the
  layernorm all-reduce, ``embedding.dp<d>`` (first and last stage), ``world`` for the clip's
  norm; ``seq`` counts a group's ops per worker in time order.

Interleaved pipelines (vpp_size > 1) are refused: their model chunks need the ``mc`` column,
which no rankscope table holds yet.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from collector.data.whatif.graph import (
    BACKWARD,
    CLIP,
    EMBEDDING,
    FORWARD,
    GC,
    GRADS_RS,
    KNOWN_OPTYPES,
    LAYERNORM,
    OPTIMIZER,
    P2P,
    PARAMS_AG,
    SEPARATE_AR,
)
from collector.tools.importers import base
from collector.tools.importers.base import Parsed

NAME = "osdi25_trace"
COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
SIZES = ("dp_size", "pp_size", "tp_size", "dsp_size", "vpp_size", "world_size")
COMPUTE = (FORWARD, BACKWARD, GC, OPTIMIZER)
TORCH_OP = {
    "forward-send": "send",
    "backward-send": "send",
    "forward-recv": "recv",
    "backward-recv": "recv",
    PARAMS_AG: "all_gather_into_tensor",
    GRADS_RS: "reduce_scatter_tensor",
    SEPARATE_AR: "all_reduce",
    LAYERNORM: "all_reduce",
    EMBEDDING: "all_reduce",
    CLIP: "all_reduce",
}
_STEP_GAP_NS = 1_000_000  # between one step's last op and the next step's first


def is_trace_schema(schema: pa.Schema) -> bool:
    return set(COLUMNS) <= set(schema.names)


def detect(path: Path) -> bool:
    if path.suffix != ".parquet":
        return False
    try:
        return is_trace_schema(pq.read_schema(path))
    except (OSError, pa.ArrowException):
        return False  # parquet_table reports an unreadable file


def meta_path(path: Path) -> Path | None:
    stem = path.stem[len("trace-") :] if path.stem.startswith("trace-") else path.stem
    for name in (f"meta-{stem}.yaml", f"meta-{stem}.yml"):
        if (path.parent / name).is_file():
            return path.parent / name
    return None


def read_meta(path: Path) -> dict:
    """The parallel sizes from ``path`` (YAML); ValueError naming the bad key."""
    with open(path, encoding="utf-8") as f:
        meta = yaml.safe_load(f)
    if not isinstance(meta, dict):
        raise ValueError("is not a mapping of keys to values")
    sizes = {}
    for key in SIZES:
        value = meta.get(key, 1 if key in ("dsp_size", "vpp_size", "tp_size") else None)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{key} must be a positive integer, not {value!r}")
        sizes[key] = value
    product = sizes["dp_size"] * sizes["pp_size"] * sizes["tp_size"] * sizes["dsp_size"]
    if sizes["world_size"] != product:
        raise ValueError(f"world_size {sizes['world_size']} is not dp x pp x tp x dsp = {product}")
    if sizes["vpp_size"] != 1:
        raise ValueError("vpp_size > 1 (an interleaved pipeline) is not supported yet")
    return sizes


def parse(path: Path) -> Parsed:
    out = Parsed(sources=[str(path)])
    meta_file = meta_path(path)
    if meta_file is None:
        out.problem(path, "", f"needs its meta file beside it (meta-{path.stem.removeprefix('trace-')}.yaml)")
        return out
    try:
        meta = read_meta(meta_file)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        out.problem(meta_file, "", f"{exc}; trace not imported")
        return out
    if pq.ParquetFile(path).metadata.num_rows > base.MAX_FILE_ROWS:
        return out.refuse("", f"more than {base.MAX_FILE_ROWS:,} rows; file skipped")
    df = pq.read_table(path, columns=list(COLUMNS)).to_pandas()
    df["optype"] = df.optype.astype(str)
    unknown = sorted(set(df.optype) - KNOWN_OPTYPES)
    if unknown:
        out.problem(path, "", f"op types rankscope's model does not know, rows skipped: {', '.join(unknown)}")
        df = df[df.optype.isin(KNOWN_OPTYPES)]
    bad = df[(df.dp_rank < 0) | (df.dp_rank >= meta["dp_size"]) | (df.stage < 0) | (df.stage >= meta["pp_size"])]
    if len(bad):
        out.problem(
            path,
            "",
            f"{len(bad)} rows with a dp_rank or stage outside dp_size {meta['dp_size']} x "
            f"pp_size {meta['pp_size']} ({meta_file.name}); rows skipped",
        )
        df = df.drop(bad.index)
    if df[["start_ts", "duration"]].isna().any().any() or (df.duration < 0).any():
        out.problem(path, "", "rows with no start, no duration or a negative one; rows skipped")
        df = df[df.start_ts.notna() & df.duration.notna() & (df.duration >= 0)]
    if df.empty:
        return out
    _rows(df, meta, out)
    return out


def _rows(df: pd.DataFrame, meta: dict, out: Parsed) -> None:
    pp = meta["pp_size"]
    workers = df[["rank", "dp_rank", "stage"]].drop_duplicates().sort_values("rank")
    run_rank = {int(r): i for i, r in enumerate(workers["rank"])}
    rank_at = {(int(d), int(s)): run_rank[int(r)] for r, d, s in workers.itertuples(index=False)}
    out.world_size = len(workers)
    # the clock restarts every step: lay the steps end to end
    df = df.assign(start_ns=(df.start_ts.astype(np.float64) * 1e9).round().astype(np.int64))
    df["dur_ns"] = (df.duration.astype(np.float64) * 1e9).round().astype(np.int64)
    span = (df.start_ns + df.dur_ns).groupby(df.step).max() - df.groupby("step").start_ns.min()
    offset = (span + _STEP_GAP_NS).cumsum().shift(fill_value=0) - df.groupby("step").start_ns.min()
    df["start_ns"] += df.step.map(offset).to_numpy()
    df = df.sort_values(["rank", "step", "start_ns"], kind="stable")
    df["run_rank"] = df["rank"].map(run_rank)
    micro_batches = df[df.optype == FORWARD].groupby(["run_rank", "step"]).size()
    for row in df.itertuples(index=False):
        rank, step, optype = row.run_rank, int(row.step), row.optype
        start, dur = int(row.start_ns), int(row.dur_ns)
        if optype in COMPUTE:
            out.add("timers", rank, "", step=step, name=optype, start_ns=start, dur_ns=dur)
            if optype in (FORWARD, BACKWARD):
                out.add(
                    "pipe",
                    rank,
                    "",
                    step=step,
                    stage=int(row.stage),
                    stages=pp,
                    data_rank=int(row.dp_rank),
                    micro_batches=int(micro_batches.get((rank, step), 0)),
                    kind="fwd" if optype == FORWARD else "bwd",
                    start_ns=start,
                    end_ns=start + dur,
                )
            continue
        group, size, peer = _group(optype, int(row.dp_rank), int(row.stage), rank, meta, rank_at, len(workers))
        out.add(
            "comm",
            rank,
            "",
            step=step,
            group_name=group,
            group_size=size,
            op=TORCH_OP[optype],
            log_name=optype,
            start_ns=start,
            end_ns=start + dur,
            async_op=optype in P2P,
            peer=peer,
        )
    _number_collectives(out)


def _group(optype, dp, stage, rank, meta, rank_at, world) -> tuple[str, int, int | None]:
    if optype in P2P:
        step = 1 if optype in ("forward-send", "backward-recv") else -1
        peer = rank_at.get((dp, stage + step))
        sends = optype.endswith("send")
        src, dst = (rank, peer) if sends else (peer, rank)
        return f"p2p[{'?' if src is None else src}->{'?' if dst is None else dst}]", 2, peer
    if optype in (PARAMS_AG, GRADS_RS, SEPARATE_AR):
        return f"dp.stage{stage}", meta["dp_size"], None
    if optype == LAYERNORM:
        return f"tp.{rank}", meta["tp_size"], None
    if optype == EMBEDDING:
        return f"embedding.dp{dp}", 2 if meta["pp_size"] > 1 else 1, None
    return "world", world, None


def _number_collectives(out: Parsed) -> None:
    """``seq``: each group's ops on a rank, counted in time order (rows are already in it)."""
    for (table, _rank), rows in out.rows.items():
        if table != "comm":
            continue
        counters: dict[str, int] = {}
        for row in rows:
            n = counters.get(row["group_name"], 0)
            row["seq"] = n
            counters[row["group_name"]] = n + 1


def settle(parsed: list[Parsed]) -> None:
    """One trace is one job: a folder of several (trace-AR and trace-SE beside each other) would
    merge different jobs' workers into one run. The first is imported, the others refused by name."""
    for other in parsed[1:]:
        if other.rows:
            other.refuse(
                "", f"a second OSDI'25 trace in one import (the first: {parsed[0].sources[0]}); import each on its own"
            )
