"""What a slow link does to a simulated step: each host's link factor per step, and the step's
time line stretched where its collectives move data.

A ring over every host runs at its slowest link's speed, so in a step where some link is F times
slower every collective of the world group moves its data F times slower. Whatever waited for
that data waits longer (the next collective, the optimizer step), and compute that did not (the
forward pass, backward kernels overlapping a bucket's transfer) keeps its duration: the step's time
line is stretched by F over the union of its collectives' transfers and left alone elsewhere. The
step grows by (F - 1) times that union, its communication by the same, so the hosts' busy time
(step less communication) is unchanged, as on real hosts whose network slowed."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from collector.tools.simulate.faults import SlowLink


class LinkRun(Protocol):
    slow_links: tuple[SlowLink, ...]

    @property
    def n_hosts(self) -> int: ...


def link_factor(sim: LinkRun, hosts: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """[len(hosts), len(steps)]: how many times slower each host's link is at each step."""
    out = np.ones((len(hosts), len(steps)))
    for link in sim.slow_links:
        out *= np.where((hosts[:, None] == link.host) & link.on(steps)[None, :], link.factor, 1.0)
    return out


def slowest(sim: LinkRun, steps: np.ndarray) -> np.ndarray:
    """[len(steps)]: the factor of a ring over every host at each step (its slowest link's)."""
    return link_factor(sim, np.arange(sim.n_hosts), steps).max(axis=0, initial=1.0)


def transfer_union(offset: np.ndarray, transfer: np.ndarray) -> np.ndarray:
    """[K, 2]: the union of the intervals [offset, offset + transfer), merged, in order."""
    merged: list[list[int]] = []
    for a, b in sorted(zip(offset.tolist(), (offset + transfer).tolist(), strict=True)):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return np.array(merged, dtype=np.int64).reshape(-1, 2)


def covered(union: np.ndarray, at: np.ndarray) -> np.ndarray:
    """How much of ``union`` lies before each time in ``at`` (any shape)."""
    a, b = union[:, 0], union[:, 1]
    return np.clip(np.asarray(at)[..., None] - a, 0, b - a).sum(axis=-1)


def stretched(union: np.ndarray, at: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """Times ``at`` (relative to the union's time line) on a step whose transfers take ``factor``
    times as long (broadcast against ``at``): each moves later by (factor - 1) times the union
    before it."""
    return (np.asarray(at) + (np.asarray(factor) - 1.0) * covered(union, at)).astype(np.int64)
