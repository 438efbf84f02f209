"""What every simulated row is made of: the world group, the jitter of a rank's entry into a
collective, noise that is a pure function of (seed, rank, index), and a table in its stored schema."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from collector.data.schema import TABLES

GROUP = "world"
JITTER_NS = 300_000  # each rank enters a collective up to this much after its planned time


def stored_table(table: str, /, **columns) -> pa.Table:
    schema = TABLES[table].arrow_schema()
    n = len(columns["step"])
    arrays = [pa.nulls(n, f.type) if columns.get(f.name) is None else pa.array(columns[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def hash_uniform(seed: int, rank: int, index: np.ndarray) -> np.ndarray:
    """Floats in [0, 1), a hash of (seed, rank, index): the same however the run is cut into blocks."""
    with np.errstate(over="ignore"):
        x = index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x ^= np.uint64((seed * 0x100000001B3 + rank * 0xBF58476D1CE4E5B9 + 1) % (1 << 64))
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def noise(seed: int, ranks: np.ndarray, steps: np.ndarray, k: int, spread: float) -> np.ndarray:
    """[R, S, k] factors in [1 - spread, 1 + spread], a function of (seed, rank, step, k)."""
    index = (steps[:, None] * k + np.arange(k)[None, :]).ravel() + (1 << 40)  # apart from the comm jitter's
    u = np.stack([hash_uniform(seed, int(r), index) for r in ranks]).reshape(len(ranks), len(steps), k)
    return 1 + spread * (2 * u - 1)
