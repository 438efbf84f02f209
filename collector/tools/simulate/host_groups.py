"""``--host-groups``: what a run over several hosts also does each step, after the template's
collectives: an all_reduce inside each host (group ``host<h>``) and one with the same local rank on
each neighbouring host (``pair<h>.<l>``: hosts h and h+1, a ring over the hosts), in three slots so
that the pairs a rank is in never overlap. A slow link (``--slow-link``) stretches the pairs
through it and every collective over all hosts, not those inside a host."""

from __future__ import annotations

from functools import partial
from typing import Protocol

import numpy as np
import pyarrow as pa

from collector.data.bandwidth import bus_factor
from collector.tools.simulate.faults import SlowLink
from collector.tools.simulate.rows import JITTER_NS, hash_uniform, stored_table
from collector.tools.simulate.slow_steps import link_factor
from collector.tools.simulate_template import Template


class HostRun(Protocol):
    """What the host-group rows are made from: a Simulation is one (this module does not import
    it, which imports this one)."""

    seed: int
    host_groups: bool
    slow_links: tuple[SlowLink, ...]
    template: Template

    @property
    def ranks_per_host(self) -> int: ...

    @property
    def n_hosts(self) -> int: ...


HOST_GROUP_BYTES = 4 << 20
INTRA_TRANSFER_NS = 2_000_000
PAIR_TRANSFER_NS = 4_000_000


def pair_slot_ns(sim: HostRun) -> int:
    slowest = max((link.factor for link in sim.slow_links), default=1.0)
    return int(PAIR_TRANSFER_NS * slowest) + 2 * JITTER_NS


def starts_at_ns(sim: HostRun) -> int:
    """When a step's host-group collectives begin, after the template's last one ends."""
    last = sim.template.collectives[-1]
    return sim.template.collective_offset_ns + last.offset_ns + last.transfer_ns + JITTER_NS


def added_step_ns(sim: HostRun) -> int:
    """What the host-group collectives add to a step: the intra-host one, three pair slots."""
    return INTRA_TRANSFER_NS + 2 * JITTER_NS + 3 * pair_slot_ns(sim) if sim.host_groups else 0


def pair_slot(sim: HostRun, pair: int) -> int:
    """Pairs a rank is in never share a slot: even pairs first, then odd, then the pair that
    closes an odd ring of hosts."""
    return 2 if sim.n_hosts % 2 and pair == sim.n_hosts - 1 else pair % 2


def comm_rows(sim: HostRun, ranks: np.ndarray, steps: np.ndarray, step_start: np.ndarray) -> pa.Table:
    """The comm rows of --host-groups for ``ranks``: per step, the all_reduce inside the rank's
    host, then one with each neighbouring host (the pairs (h-1, h) and (h, h+1) of its local rank)."""
    per, n_hosts = sim.ranks_per_host, sim.n_hosts
    host, local = ranks // per, ranks % per
    pairs = np.stack([(host - 1) % n_hosts, host], axis=1)  # [R, 2]: pair p joins hosts p and p+1
    slots = np.vectorize(partial(pair_slot, sim))(pairs)
    # a pair's transfer: its slower host's link decides
    factor = np.stack(
        [np.maximum(link_factor(sim, p, steps), link_factor(sim, (p + 1) % n_hosts, steps)) for p in pairs.T],
        axis=1,
    )  # [R, 2, S]
    at = step_start[None, :] + starts_at_ns(sim)  # [1, S]
    pair_at = at + INTRA_TRANSFER_NS + 2 * JITTER_NS
    planned = np.concatenate(
        [
            np.broadcast_to(at, (len(ranks), len(steps)))[:, :, None],
            (pair_at[:, :, None] + slots[:, None, :] * pair_slot_ns(sim)),
        ],
        axis=2,
    )  # fmt: skip  [R, S, 3]
    transfer = np.concatenate(
        [np.full((len(ranks), len(steps), 1), INTRA_TRANSFER_NS), PAIR_TRANSFER_NS * factor.transpose(0, 2, 1)],
        axis=2,
    )
    index = steps[None, :, None] * 3 + np.arange(3)[None, None, :] + (1 << 42)
    jitter = np.stack([hash_uniform(sim.seed, int(r), index.ravel()) for r in ranks]).reshape(planned.shape)
    start = planned + (jitter * JITTER_NS).astype(np.int64)
    end = planned + JITTER_NS + transfer.astype(np.int64)
    groups = np.stack(
        [np.char.add("host", host.astype(str))]
        + [np.char.add(np.char.add(np.char.add("pair", p.astype(str)), "."), local.astype(str)) for p in pairs.T],
        axis=1,
    )  # [R, 3]
    sizes = np.array([per, 2, 2])
    n = start.size
    algbw = HOST_GROUP_BYTES / (end - start)
    busbw = algbw * np.array([bus_factor("all_reduce", int(x)) for x in sizes])[None, None, :]
    return stored_table(
        "comm",
        rank=np.repeat(ranks, len(steps) * 3),
        step=np.tile(np.repeat(steps, 3), len(ranks)),
        group_name=np.repeat(groups[:, None, :], len(steps), axis=1).ravel().tolist(),
        group_size=np.tile(sizes, len(ranks) * len(steps)),
        seq=np.tile(np.repeat(steps, 3), len(ranks)),
        op=["all_reduce"] * n,
        log_name=["host_groups.all_reduce"] * n,
        dtype=["float32"] * n,
        numel=np.full(n, HOST_GROUP_BYTES // 4),
        bytes=np.full(n, HOST_GROUP_BYTES),
        start_ns=start.ravel(),
        end_ns=end.ravel(),
        async_op=np.zeros(n, dtype=bool),
        algbw_gbs=algbw.ravel(),
        busbw_gbs=busbw.ravel(),
        peer=np.full(n, -1),
    )
