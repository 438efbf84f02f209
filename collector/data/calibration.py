"""Calibrated bandwidth: what ``rankscope calibrate`` measured on a set of hosts, stored in the
data dir and used by later runs on the same hosts as what a transfer should cost.

    D/calibration/hosts-<key>.parquet    one file per host set; <key>: the first 16 hex of the
                                         sha256 of the sorted host names, comma-joined

One row per (op, bytes, span, group_size): ``op`` the collective's family (all_reduce,
all_gather, reduce_scatter, broadcast), ``bytes`` its data size S as the comm table counts it
(nccl-tests': all_gather the gathered output, reduce_scatter the full input), ``span`` ``intra``
(a group inside one host) or ``inter`` (across hosts), ``group_size``, ``groups`` (how many such
groups were measured), ``time_us`` (per collective: the median over iterations of the slowest
rank's time, the slowest group of the kind), ``busbw_gbs`` (nccl-tests' busbw of that time),
``host_set`` (the sorted names, comma-joined), ``measured_at``. A later sweep of the same hosts
replaces the file.

``expected_ms`` reads it: per collective of a run, the calibrated time at its size, interpolated
log-log between the two measured sizes around it, NaN outside the sizes measured or for a kind
not measured (collector.data.findings.links then keeps the run-learned expectation).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

DIR = "calibration"
SCHEMA = pa.schema(
    [
        ("host_set", pa.string()),
        ("op", pa.string()),
        ("bytes", pa.int64()),
        ("span", pa.string()),
        ("group_size", pa.int64()),
        ("groups", pa.int64()),
        ("time_us", pa.float64()),
        ("busbw_gbs", pa.float64()),
        ("measured_at", pa.timestamp("us", tz="UTC")),
    ]
)
FAMILIES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def family(op: str) -> str | None:
    """The family a torch.distributed op name belongs to ('all_gather_into_tensor' -> 'all_gather')."""
    name = op.lstrip("_")
    if name.endswith("_base"):
        name = name[: -len("_base")]
    return next((f for f in FAMILIES if name.startswith(f)), None)


def host_set(hosts) -> str:
    return ",".join(sorted({str(h) for h in hosts}))


def path(data_dir, hosts) -> Path:
    key = hashlib.sha256(host_set(hosts).encode()).hexdigest()[:16]
    return Path(data_dir) / DIR / f"hosts-{key}.parquet"


def write(data_dir, hosts, rows: pd.DataFrame) -> Path:
    """Store ``rows`` (the SCHEMA's columns but host_set) as the calibration of ``hosts``; atomic."""
    target = path(data_dir, hosts)
    target.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(
        rows.assign(host_set=host_set(hosts))[SCHEMA.names], schema=SCHEMA, preserve_index=False
    )
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, target)
    return target


def load(data_dir, hosts) -> pd.DataFrame | None:
    """The calibration of exactly ``hosts`` in ``data_dir``, or None (none stored, or unreadable)."""
    if not len(hosts):
        return None
    p = path(data_dir, hosts)
    try:
        frame = pq.read_table(p).to_pandas()
    except (OSError, pa.ArrowInvalid):
        return None
    frame = frame[frame.host_set == host_set(hosts)]  # a hash collision is no match
    return frame if not frame.empty else None


def expected_ms(calibration: pd.DataFrame, op, nbytes, span, size) -> np.ndarray:
    """Per collective (``op``, ``nbytes``, ``span``, ``size``: equal-length sequences) its calibrated
    time in ms, NaN where the calibration does not cover it."""
    out = np.full(len(op), np.nan)
    kinds = pd.DataFrame({"family": [family(str(o)) for o in op], "bytes": nbytes, "span": span, "size": size})
    for (fam, sp, n), idx in kinds.groupby(["family", "span", "size"]).groups.items():
        measured = calibration[
            (calibration.op == fam) & (calibration.span == sp) & (calibration.group_size == n)
        ].sort_values("bytes")
        if len(measured) < 1:
            continue
        x = np.log(measured.bytes.to_numpy(dtype=float))
        y = np.log(measured.time_us.to_numpy(dtype=float) / 1e3)
        at = np.log(np.clip(kinds.loc[idx, "bytes"].to_numpy(dtype=float), 1, None))
        inside = (at >= x[0]) & (at <= x[-1])
        out[np.asarray(idx)[inside]] = np.exp(np.interp(at[inside], x, y))
    return out
