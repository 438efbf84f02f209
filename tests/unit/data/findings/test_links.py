"""Slow links (collector/data/findings/links.py) on simulated runs written through the real
Store and read back through the catalog: named and localised where a host's link is slow,
silent where nothing is, and never confused with a compute straggler (either way)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.data import calibration, findings, queries
from collector.data.findings import link_side, links
from collector.tools import simulate


def health(tmp_path, **kwargs) -> list[findings.Finding]:
    sim = simulate.Simulation(run_id="links", **kwargs)
    simulate.write_data_dir(sim, tmp_path / "d")
    cat = queries.Catalog(tmp_path / "d")
    try:
        return findings.for_run(cat, "links")
    finally:
        cat.close()


def only(found, kind):
    return [f for f in found if f.kind == kind]


def expected_cost_ms(sim: simulate.Simulation, factor: float) -> float:
    """What a rank on the slow host loses per step, from the generator's own parameters: the
    template's collectives over every host big enough to be bandwidth, and its two pairs."""
    template = sum(c.transfer_ns for c in sim.template.collectives if c.bytes >= links.MIN_BYTES)
    return (template + 2 * simulate.PAIR_TRANSFER_NS) * (factor - 1) / 1e6


def test_a_slow_host_link_is_named_with_its_onset_end_and_cost(tmp_path):
    kwargs = dict(ranks=64, hosts=8, steps=50, slow_links=(simulate.SlowLink(3, 4.0, 20, 35),))
    found = health(tmp_path, **kwargs)
    [link] = only(found, "slow_link")
    assert link.evidence["hosts"] == [["node-0003"]], link.text
    assert abs(link.evidence["onset_step"] - 20) <= 3 and link.evidence["detected_step"] - 20 <= 10
    assert abs(link.evidence["end_step"] - 35) <= 3
    assert "node-0003's link" in link.text and "ended at step" in link.text
    assert link.evidence["factor"] == pytest.approx(4.0, rel=0.15)
    assert link.cost_ms_per_step == pytest.approx(expected_cost_ms(simulate.Simulation(**kwargs), 4.0), rel=0.25)
    assert set(link.ranks) == set(range(24, 32))  # the host's ranks
    assert not only(found, "straggler")


def test_a_healthy_run_over_hosts_has_no_link_finding_and_no_warning(tmp_path):
    found = health(tmp_path, ranks=64, hosts=8, steps=50, host_groups=True)
    assert not [f for f in found if f.severity in ("warning", "critical")], [f.text for f in found]


def test_a_compute_straggler_is_a_straggler_not_a_slow_link(tmp_path):
    found = health(
        tmp_path, ranks=64, hosts=8, steps=50, host_groups=True, stragglers=(simulate.Straggler(27, 40_000_000, 20),)
    )
    assert not only(found, "slow_link")
    assert [f.ranks for f in only(found, "straggler")] == [(27,)]


@pytest.mark.slow  # make test keeps the 64-rank cases; real 2- and 3-host runs cover these too
def test_a_slow_link_is_not_a_straggler_even_when_its_ranks_arrive_late(tmp_path):
    # Straggler and slow link in one run, on different hosts: each told once, by its own finding.
    found = health(
        tmp_path,
        ranks=64,
        hosts=8,
        steps=50,
        slow_links=(simulate.SlowLink(5, 4.0, 20),),
        stragglers=(simulate.Straggler(9, 40_000_000, 20),),
    )
    assert [f.evidence["hosts"] for f in only(found, "slow_link")] == [[["node-0005"]]]
    assert [f.ranks for f in only(found, "straggler")] == [(9,)]
    assert only(found, "slow_link")[0].evidence["end_step"] is None  # never restored


@pytest.mark.slow  # make test keeps the 64-rank cases; real 2- and 3-host runs cover these too
def test_three_hosts_name_the_right_one_and_two_name_it_by_its_telemetry_or_both(tmp_path):
    [three] = only(
        health(tmp_path / "3", ranks=12, hosts=3, steps=40, slow_links=(simulate.SlowLink(2, 4.0, 15),)), "slow_link"
    )
    assert three.evidence["hosts"] == [["node-0002"]]
    # two hosts: every group across hosts spans both, so either link explains it; what tells them
    # apart is the telemetry, which only the slow host's link delays...
    two = dict(ranks=8, hosts=2, steps=40, slow_links=(simulate.SlowLink(1, 4.0, 15),))
    [named] = only(health(tmp_path / "2", **two), "slow_link")
    assert named.evidence["hosts"] == [["node-0001"]], named.text
    assert "node-0001's telemetry arrived unevenly" in named.text
    # ... unless it takes another network: then both, said as such
    [both] = only(health(tmp_path / "2apart", **two, telemetry_apart=True), "slow_link")
    assert both.evidence["hosts"] == [["node-0000"], ["node-0001"]]
    assert "node-0000's link or node-0001's link" in both.text


def test_change_points_find_a_step_up_and_its_end_and_nothing_in_noise():
    rng = np.random.default_rng(0)
    steps = np.arange(60)
    noise = rng.normal(0, 0.05, 60)
    up = noise + np.where((steps >= 20) & (steps < 40), np.log(4.0), 0.0)
    [(onset, alarm, end)] = links.change_points(steps, up, np.log(links.SLOW_RATIO))
    assert onset == 20 and alarm <= 22 and end == 40
    assert links.change_points(steps, noise, np.log(links.SLOW_RATIO)) == []
    # one spike is no change
    spike = noise.copy()
    spike[30] = np.log(4.0)
    assert links.change_points(steps, spike, np.log(links.SLOW_RATIO)) == []


@pytest.mark.slow
def test_one_slow_host_of_128_named_at_1024_ranks(tmp_path):
    found = health(tmp_path, ranks=1024, hosts=128, steps=60, slow_links=(simulate.SlowLink(77, 4.0, 25, 45),))
    [link] = only(found, "slow_link")
    assert link.evidence["hosts"] == [["node-0077"]]
    assert abs(link.evidence["onset_step"] - 25) <= 3 and abs(link.evidence["end_step"] - 45) <= 3
    assert not only(found, "straggler")


def test_the_busbw_envelope_comes_from_healthy_steps_and_marks_what_the_link_pushed_under_it(tmp_path):
    sim = simulate.Simulation(
        run_id="env", ranks=32, hosts=4, steps=40, slow_links=(simulate.SlowLink(1, 4.0, 20, 30),)
    )
    simulate.write_data_dir(sim, tmp_path / "d")
    cat = queries.Catalog(tmp_path / "d")
    rollup = queries.comm_rollup(cat, "env")
    by_step = queries.busbw_by_step_size(rollup)
    [link] = only(findings.for_run(cat, "env"), "slow_link")
    cat.close()
    band, marks = links.busbw_envelope(by_step, [link])
    host_groups = band[band.bytes == simulate.HOST_GROUP_BYTES].set_index("op")
    assert (band.low <= band.mid).all() and (band.mid <= band.high).all()
    # the band is the healthy steps' (a pair's 4 ms per 4 MiB all_reduce gives ~1 GB/s), not the slow ones'
    healthy = by_step[(by_step.step < 20) & (by_step.bytes == simulate.HOST_GROUP_BYTES)].busbw_gbs
    assert healthy.quantile(0.1) <= host_groups.loc["all_reduce", "mid"] <= healthy.quantile(0.9)
    assert not marks.empty and set(marks.steps) == {f"{link.steps[0]}-{link.steps[1]}"}
    assert (marks.merge(band, on=["op", "bytes"]).eval("busbw_gbs < low")).all()
    # nothing slow: no marks
    assert links.busbw_envelope(by_step, [])[1].empty


def test_link_health_puts_the_slow_host_on_top_and_folds_the_rest_into_one_row(tmp_path):
    sim = simulate.Simulation(run_id="grid", ranks=64, hosts=8, steps=40, slow_links=(simulate.SlowLink(5, 4.0, 20),))
    simulate.write_data_dir(sim, tmp_path / "d")
    cat = queries.Catalog(tmp_path / "d")
    rollup = queries.comm_rollup(cat, "grid")
    ratios = links.transfer_ratios(
        queries.link_transfers(rollup), queries.group_members(rollup), queries.ranks(cat, "grid")
    )
    # the messages links reads, asked for alone (what for_run does): the same ratios, from fewer rows
    big = queries.link_transfers(rollup, links.MIN_BYTES)
    assert big.bytes.min() >= links.MIN_BYTES and len(big) < len(queries.link_transfers(rollup))
    same = links.transfer_ratios(big, queries.group_members(rollup), queries.ranks(cat, "grid"))
    pd.testing.assert_frame_equal(same.per_group, ratios.per_group)
    cat.close()
    per_host = links.host_link_ratios(ratios)
    assert set(per_host.host) == {sim.host(r) for r in range(0, 64, 8)}
    grid = links.link_health_grid(per_host, max_rows=4, max_steps=10)
    assert len(grid) == 4 and grid.shape[1] <= 10
    assert grid.index[0] == "node-0005" and grid.index[-1] == "others: 5 hosts (median)"
    # its neighbours share its pairs, half of them slow: next; the far hosts stay at speed
    assert set(grid.index[1:3]) == {"node-0004", "node-0006"}
    assert grid.iloc[-1].max() < 1.3 < grid.iloc[0].max()


def flushes(ranks_by_host: dict[str, list[int]], queued: str | None, slow_from: int, steps: int, seed: int = 0):
    """Hand-made queries.deliveries: each rank flushes 4 envelopes every 200 ms (2 per step), arriving
    within a few ms; from step ``slow_from`` the ``queued`` host's flushes wait 0-40 ms in a queue
    (a link that fills and drains), the others' 0-1 ms as before."""
    rng = np.random.default_rng(seed)
    rows = []
    for host, ranks in ranks_by_host.items():
        for rank in ranks:
            for k in range(2 * steps):
                step = k // 2
                wait = rng.uniform(0, 40e6) if host == queued and step >= slow_from else rng.uniform(0, 1e6)
                at = 1_000_000_000 + k * 200_000_000 + rank * 7_000_000 + int(wait)
                rows += [(rank, step, at - 150_000_000, at + e * 300_000) for e in range(4)]
    return pd.DataFrame(rows, columns=["rank", "step", "made_ns", "received_ns"])


@pytest.mark.parametrize("queued", ["node-0000", "node-0001", None])
def test_two_hosts_the_tie_is_broken_by_whose_telemetry_arrived_unevenly_and_only_then(tmp_path, queued):
    sim = simulate.Simulation(run_id="two", ranks=8, hosts=2, steps=40, slow_links=(simulate.SlowLink(1, 4.0, 15),))
    simulate.write_data_dir(sim, tmp_path / "d")
    cat = queries.Catalog(tmp_path / "d")
    rollup = queries.comm_rollup(cat, "two")
    frames = (queries.link_transfers(rollup), queries.group_members(rollup), queries.ranks(cat, "two"))
    cat.close()
    by_host = frames[2].groupby("host")["rank"].apply(list).to_dict()
    [link] = links.slow_links(*frames, None, flushes(by_host, queued, 15, 40))
    if queued is None:  # even arrival on both: the groups' "or" stays, and says why
        assert link.evidence["hosts"] == [["node-0000"], ["node-0001"]], link.text
        assert "node-0000's link or node-0001's link" in link.text
        assert "the telemetry's arrival does not tell them apart" in link.text
    else:
        assert link.evidence["hosts"] == [[queued]], link.text
        assert f"{queued}'s link;" in link.text and f"{queued}'s telemetry arrived unevenly" in link.text
        assert link.evidence["telemetry_jitter_z"] >= link_side.MIN_Z
    # without arrival times (an imported run, a collector before them) it says so and keeps the "or"
    [bare] = links.slow_links(*frames, None, None)
    assert bare.evidence["hosts"] == [["node-0000"], ["node-0001"]] and "no telemetry arrival times" in bare.text


def test_a_host_whose_flushes_all_arrive_late_but_evenly_is_not_named():
    # a constant delay (a longer route, a clock offset) is no queue: spacing, not lag, is judged
    d = flushes({"a": [0, 1], "b": [2, 3]}, None, 15, 40)
    d.loc[d["rank"] < 2, "received_ns"] += 80_000_000
    side = link_side.which_side(d, {0: "a", 1: "a", 2: "b", 3: "b"}, ["a", "b"], [(15, 41)])
    assert side.hosts == () and side.z is not None and side.z < link_side.MIN_Z
    # and too few flushes to judge is said as such
    short = link_side.which_side(d[d.step < 17], {0: "a", 1: "a", 2: "b", 3: "b"}, ["a", "b"], [(15, 41)])
    assert short.hosts == () and "too few telemetry flushes" in short.sentence


def sweep_of(data_dir, run_id) -> pd.DataFrame:
    """A calibration table as `rankscope calibrate` writes one, measured here on a healthy run's own
    collectives: per (op family, bytes, span, group size) the median time per collective."""
    cat = queries.Catalog(data_dir)
    rollup = queries.comm_rollup(cat, run_id)
    ratios = links.transfer_ratios(
        queries.link_transfers(rollup), queries.group_members(rollup), queries.ranks(cat, run_id)
    )
    cat.close()
    t = ratios.rows.groupby(["op", "bytes", "span", "size"]).per_coll_ms.median().reset_index()
    return pd.DataFrame(
        {
            "op": [calibration.family(op) for op in t.op],
            "bytes": t.bytes,
            "span": t.span,
            "group_size": t["size"],
            "groups": 1,
            "time_us": t.per_coll_ms * 1e3,
            "busbw_gbs": 0.0,
            "measured_at": pd.Timestamp.now(tz="UTC"),
        }
    )


def test_a_link_slow_from_the_first_step_is_found_only_against_a_calibration_of_its_hosts(tmp_path):
    healthy = simulate.Simulation(run_id="calm", ranks=32, hosts=4, steps=40, host_groups=True)
    simulate.write_data_dir(healthy, tmp_path / "calm")
    sweep = sweep_of(tmp_path / "calm", "calm")
    hosts = [healthy.host(r) for r in range(32)]
    # slow from the start: the run itself has nothing healthy to learn from, so without a
    # calibration nothing is found ...
    slow = dict(ranks=32, hosts=4, steps=40, slow_links=(simulate.SlowLink(2, 4.0, 0),))
    assert not only(health(tmp_path / "bare", **slow), "slow_link")
    # ... with one of these hosts, the link is named from the expected times the sweep gave
    calibration.write(tmp_path / "swept" / "d", hosts, sweep)
    [link] = only(health(tmp_path / "swept", **slow), "slow_link")
    assert link.evidence["hosts"] == [["node-0002"]] and link.evidence["expected_from"] == "calibration", link.text
    assert link.evidence["factor"] == pytest.approx(4.0, rel=0.2) and "calibrated before" in link.text
    # a healthy run judged by the same calibration: nothing
    calibration.write(tmp_path / "fine" / "d", hosts, sweep)
    assert not only(health(tmp_path / "fine", ranks=32, hosts=4, steps=40, host_groups=True), "slow_link")
    # a calibration of other hosts is not used
    calibration.write(tmp_path / "other" / "d", [*hosts[:-1], "elsewhere"], sweep)
    assert not only(health(tmp_path / "other", **slow), "slow_link")


def test_calibrated_times_interpolate_between_sizes_and_cover_nothing_else():
    sweep = pd.DataFrame(
        {"op": "all_reduce", "bytes": [1 << 20, 4 << 20], "span": "inter", "group_size": 2, "time_us": [1000.0, 4000.0]}
    )
    got = calibration.expected_ms(
        sweep,
        ["all_reduce", "all_reduce", "all_reduce", "all_gather_into_tensor", "all_reduce"],
        [2 << 20, 1 << 20, 8 << 20, 2 << 20, 2 << 20],
        ["inter", "inter", "inter", "inter", "intra"],
        [2, 2, 2, 2, 2],
    )
    assert got[:2] == pytest.approx([2.0, 1.0])  # log-log between 1 and 4 ms: 2 MiB takes 2 ms
    assert np.isnan(got[2:]).all()  # past the sizes swept, another op, another span
    assert calibration.family("_reduce_scatter_base") == "reduce_scatter" and calibration.family("barrier") is None


def world_only(slow_from: int, factor: float, busy_factor: float = 1.0, steps: int = 50, seed: int = 0):
    """A plain DDP job's frames: 3 hosts, one rank each, the world group only; its all_reduce's
    transfer (15 ms) x ``factor`` from step ``slow_from`` and each rank's busy time (40 ms) x
    ``busy_factor`` from then (a host's own slowdown, not its link's)."""
    rng = np.random.default_rng(seed)
    at = np.arange(1, steps + 1)
    slow = at >= slow_from
    transfer = 15.0 * np.where(slow, factor, 1.0) * rng.uniform(0.95, 1.05, steps)
    transfers = pd.DataFrame(
        {"group_name": "world", "step": at, "op": "all_reduce", "bytes": 2 << 20, "transfer_ms": transfer, "n": 1}
    )
    members = pd.DataFrame({"group_name": "world", "rank": [0, 1, 2]})
    hosts = pd.DataFrame({"rank": [0, 1, 2], "host": ["host-0", "host-1", "host-2"]})
    busy = 40.0 * np.where(slow, busy_factor, 1.0)
    rows = [
        (r, s, b + t + w, t + w, w)
        for r in range(3)
        for s, t, b, w in zip(at, transfer, busy, rng.uniform(0, 2, steps), strict=True)
    ]
    steps_ = pd.DataFrame(rows, columns=["rank", "step", "step_ms", "comm_ms", "waiting_ms"])
    return transfers, members, hosts, steps_


def test_the_world_group_only_a_transfer_collapse_is_the_network_with_its_size_and_an_honest_or():
    [link] = links.slow_links(*world_only(25, 8.0))
    assert link.evidence["control"] == "compute" and link.evidence["onset_step"] == 25, link.text
    assert link.evidence["factor"] == pytest.approx(8.0, rel=0.2)
    assert link.cost_ms_per_step == pytest.approx(7 * 15, rel=0.2)
    # nothing tells the hosts apart here (no telemetry arrival times): every host, "or"
    assert link.evidence["hosts"] == [["host-0"], ["host-1"], ["host-2"]], link.text
    assert "compute on every host unchanged" in link.text and " or " in link.text


def test_the_world_group_only_hosts_that_slowed_themselves_are_not_a_link():
    # transfer and compute both slower (a loaded host): not the network
    assert not links.slow_links(*world_only(25, 3.0, busy_factor=2.0))
    assert not links.slow_links(*world_only(60, 1.0))  # healthy


def test_the_onset_is_where_the_series_steps_up_not_where_noise_began_to_pile_up():
    # 5 noisy steps above the reference (a loaded host) just before a 7x slowdown at step 15: the
    # CUSUM last stood at 0 at step 9, the slowdown began at 15
    x = np.array([0.0] * 10 + [0.6] * 5 + [2.0] * 10)
    [(onset, alarm, end)] = links.change_points(np.arange(len(x)), x, np.log(links.SLOW_RATIO))
    assert (onset, end) == (15, None) and alarm - onset <= 1


# ---- the world group only (plain DDP/FSDP over every rank: no group inside a host) ----------------


def test_world_only_a_slow_link_is_the_network_named_by_its_telemetry_never_a_straggler(tmp_path):
    found = health(tmp_path, ranks=64, hosts=8, steps=50, world_only=True, slow_links=(simulate.SlowLink(3, 4.0, 20),))
    [link] = only(found, "slow_link")
    assert link.evidence["hosts"] == [["node-0003"]], link.text
    assert link.evidence["control"] == "compute" and "compute on every host unchanged" in link.text
    assert abs(link.evidence["onset_step"] - 20) <= 2 and link.evidence["detected_step"] - 20 <= 10
    assert link.evidence["factor"] == pytest.approx(4.0, rel=0.15)
    assert link.evidence["slowed_groups"] == ["world"] and "groups spanning all 8 hosts" in link.text
    assert "node-0003's telemetry arrived unevenly" in link.text
    assert not only(found, "straggler")
    # its telemetry taking another network: nothing tells the hosts apart, so every one, "or"
    found = health(
        tmp_path / "apart",
        ranks=64,
        hosts=8,
        steps=50,
        world_only=True,
        telemetry_apart=True,
        slow_links=(simulate.SlowLink(3, 4.0, 20),),
    )
    [link] = only(found, "slow_link")
    assert link.evidence["hosts"] == [[f"node-{h:04d}"] for h in range(8)], link.text
    assert "does not tell them apart" in link.text and not only(found, "straggler")
    assert "the link of one of 8 hosts (node-0000 ... node-0007" in link.text  # a count, not 8 names


def test_world_only_healthy_is_silent_and_a_compute_straggler_stays_one(tmp_path):
    found = health(tmp_path / "calm", ranks=64, hosts=8, steps=50, world_only=True)
    assert not [f for f in found if f.severity in ("warning", "critical")], [f.text for f in found]
    found = health(
        tmp_path / "late",
        ranks=64,
        hosts=8,
        steps=50,
        world_only=True,
        stragglers=(simulate.Straggler(27, 40_000_000, 20),),
    )
    assert not only(found, "slow_link")
    assert [f.ranks for f in only(found, "straggler")] == [(27,)]


@pytest.mark.parametrize("world_only", [True, False])
def test_a_link_that_flaps_is_one_finding_with_every_episode(tmp_path, world_only):
    """Host 3's link slow 5 steps of every 20: told once, its four episodes listed, not four warnings."""
    flaps = tuple(simulate.SlowLink(3, 4.0, s, s + 5) for s in (20, 40, 60, 80))
    found = health(tmp_path, ranks=64, hosts=8, steps=100, world_only=world_only, slow_links=flaps)
    [link] = only(found, "slow_link")
    assert link.evidence["hosts"] == [["node-0003"]], link.text
    episodes = link.evidence["episodes"]
    assert len(episodes) == 4 and all(
        abs(o - s) <= 2 and abs(e - s - 5) <= 2 for (o, e), s in zip(episodes, (20, 40, 60, 80))
    )
    assert link.steps[0] <= 22 and link.steps[1] >= 83 and "the link flaps: slow 4 times" in link.text
    assert set(link.ranks) == set(range(24, 32))  # the host's ranks
    assert not only(found, "straggler")


@pytest.mark.parametrize("world_only", [True, False])
def test_two_links_slow_at_once_are_both_named(tmp_path, world_only):
    both = (simulate.SlowLink(2, 4.0, 30), simulate.SlowLink(5, 4.0, 30))
    found = health(tmp_path, ranks=64, hosts=8, steps=60, world_only=world_only, slow_links=both)
    [link] = only(found, "slow_link")
    assert link.evidence["hosts"] == [["node-0002", "node-0005"]], link.text
    assert "the links of node-0002 and node-0005" in link.text and not only(found, "straggler")
    if world_only:  # over the world group, their telemetry tells: both queued
        assert "the telemetry of node-0002 and node-0005 arrived unevenly" in link.text


def test_world_only_a_link_slow_from_the_start_is_found_only_against_a_calibration(tmp_path):
    """Plain DDP over the world, host 2's link 8x slower from step 0: the run has no healthy stretch,
    so nothing shows it is slow -- unless rankscope calibrate measured these hosts: then it is the
    network, said against the sweep; a healthy run under the same calibration stays silent."""
    healthy = simulate.Simulation(run_id="calm", ranks=32, hosts=4, steps=40, world_only=True)
    simulate.write_data_dir(healthy, tmp_path / "calm")
    sweep = sweep_of(tmp_path / "calm", "calm")
    hosts = [healthy.host(r) for r in range(32)]
    slow = dict(ranks=32, hosts=4, steps=40, world_only=True, slow_links=(simulate.SlowLink(2, 8.0, 0),))
    assert not only(health(tmp_path / "bare", **slow), "slow_link")
    calibration.write(tmp_path / "swept" / "d", hosts, sweep)
    found = health(tmp_path / "swept", **slow)
    [link] = only(found, "slow_link")
    assert link.evidence["control"] == "calibration" and link.evidence["expected_from"] == "calibration", link.text
    assert link.evidence["hosts"] == [["node-0002"]], link.text  # its telemetry queued all along
    assert "what rankscope calibrate measured on these hosts" in link.text and not only(found, "straggler")
    calibration.write(tmp_path / "fine" / "d", hosts, sweep)
    assert not only(health(tmp_path / "fine", ranks=32, hosts=4, steps=40, world_only=True), "slow_link")


def test_world_only_a_transfer_slowed_with_the_ranks_wait_for_a_cpu_is_the_hosts_not_a_link(tmp_path):
    """A loaded CPU slows a CPU-driven transfer (gloo) while DDP hides the step's compute under it,
    so the busy time stays put: the ranks' wait for a CPU (signals' runqueue_ms) rising with the
    transfer says it is the hosts. The same slowdown with the wait flat is the network."""
    sim = simulate.Simulation(
        run_id="cpu", ranks=24, hosts=3, steps=50, world_only=True, slow_links=(simulate.SlowLink(1, 2.0, 25),)
    )
    simulate.write_data_dir(sim, tmp_path / "d")
    cat = queries.Catalog(tmp_path / "d")
    rollup = queries.comm_rollup(cat, "cpu")
    frames = (queries.link_transfers(rollup, links.MIN_BYTES), queries.group_members(rollup), queries.ranks(cat, "cpu"))
    steps, deliveries = queries.step_analysis(cat, "cpu"), queries.deliveries(cat, "cpu")
    cat.close()
    grid = pd.MultiIndex.from_product([range(24), range(50)], names=["rank", "step"]).to_frame(index=False)
    flat = grid.assign(runqueue_ms=2.0)
    loaded = grid.assign(runqueue_ms=np.where(grid.step >= 25, 60.0, 2.0))
    [link] = links.slow_links(*frames, steps, deliveries, None, flat)
    assert link.evidence["hosts"] == [["node-0001"]], link.text
    assert links.slow_links(*frames, steps, deliveries, None, loaded) == []


def probe_rows(request_id: str, step: int, slow_host: str | None, time_ns: int = 1) -> pd.DataFrame:
    """What ``rankscope probe`` stores for 3 hosts and the collector: every path through
    ``slow_host`` at 90 Mbit/s, the rest at 9 Gbit/s (collector.server.probe's rows)."""
    rows = []
    ends = {"host-0": 0, "host-1": 1, "host-2": 2}
    for i, (host, rank) in enumerate(ends.items()):
        peers = [(p, r) for p, r in list(ends.items())[i + 1 :]] + [("collector", -1)]
        for peer, peer_rank in peers:
            slow = slow_host in (host, peer)
            for direction in ("send", "receive"):
                rows.append(dict(rank=rank, step=step, request_id=request_id, status="measured", host=host,
                                 peer_rank=peer_rank, peer_host=peer, direction=direction,
                                 mbit_s=90.0 if slow else 9000.0, time_ns=time_ns))  # fmt: skip
    return pd.DataFrame(rows)


def test_the_world_group_only_a_probe_while_it_lasted_settles_the_or():
    frames = world_only(25, 8.0)
    probed = probe_rows("probe-1", 35, "host-1")
    [link] = links.slow_links(*frames, probes=probed)
    assert link.evidence["hosts"] == [["host-1"]] and link.evidence["probe"] == "probe-1", link.text
    assert link.ranks == (1,)
    assert "host-1's link; costs" in link.text and "a link probe while it lasted (probe-1)" in link.text
    # a probe before the slowdown, one that names no host, or one naming a host outside the "or": still "or"
    for other in (probe_rows("early", 10, "host-1"), probe_rows("calm", 35, None)):
        [link] = links.slow_links(*frames, probes=other)
        assert link.evidence["hosts"] == [["host-0"], ["host-1"], ["host-2"]] and link.evidence["probe"] is None
    # healthy: a probe changes nothing
    assert not links.slow_links(*world_only(60, 1.0), probes=probe_rows("calm", 35, None))


def pipeline(slow_host: int | None, steps: int = 50, slow_from: int = 25, factor: float = 8.0, seed: int = 0):
    """A pipeline of 2 stages x 2 data-parallel replicas, one rank a host (pipe_train.py over 4
    namespace hosts): each stage's replicas all-reduce over a group across 2 hosts (g[0-1], g[2-3]),
    each replica's stages exchange activations and gradients (p2p[0->2], p2p[2->0], p2p[1->3],
    p2p[3->1]). From ``slow_from`` host ``slow_host``'s link is ``factor`` x slower: its groups'
    all_reduce and the recvs through it. Every sender's isend, ended when its schedule waits on it,
    stretches with the whole pipeline (as measured: 73 -> 251 ms on a pair the link never carried)."""
    rng = np.random.default_rng(seed)
    members = {"g[0-1]": [0, 1], "g[2-3]": [2, 3], "p2p[0->2]": [0, 2], "p2p[2->0]": [0, 2],
               "p2p[1->3]": [1, 3], "p2p[3->1]": [1, 3]}  # fmt: skip
    rows = []
    for step in range(1, steps + 1):
        slow = slow_host is not None and step >= slow_from
        for group, ranks in members.items():
            through = slow and f"{slow_host}" in {str(r) for r in ranks}
            x = factor if through else 1.0
            noise = rng.uniform(0.9, 1.1)
            if group.startswith("g["):
                rows.append((group, step, "all_reduce", 4 << 20, 8.0 * x * noise, 4))
            else:
                rows.append((group, step, "recv", 128 << 10, 6.0 * x * noise, 4))
                rows.append((group, step, "isend", 128 << 10, (250.0 if slow else 75.0) * noise, 4))
    transfers = pd.DataFrame(rows, columns=["group_name", "step", "op", "bytes", "transfer_ms", "n"])
    members_ = pd.DataFrame([(g, r) for g, rs in members.items() for r in rs], columns=["group_name", "rank"])
    hosts = pd.DataFrame({"rank": [0, 1, 2, 3], "host": [f"host-{r}" for r in range(4)]})
    # the link's time adds to every rank's communication, and so to its step; its compute stays
    late = [100.0 if slow_host is not None and s >= slow_from else 0.0 for s in range(1, steps + 1)]
    busy = [
        (r, s, 80.0 + late[s - 1], 60.0 + late[s - 1], rng.uniform(0, 2)) for r in range(4) for s in range(1, steps + 1)
    ]
    steps_ = pd.DataFrame(busy, columns=["rank", "step", "step_ms", "comm_ms", "waiting_ms"])
    return transfers, members_, hosts, steps_


@pytest.mark.parametrize("slow_host", [0, 2])
def test_a_pipeline_over_hosts_names_the_host_by_its_stage_groups_and_point_to_point_pairs(slow_host):
    [link] = links.slow_links(*pipeline(slow_host))
    assert link.evidence["hosts"] == [[f"host-{slow_host}"]], link.text
    assert link.evidence["onset_step"] == 25 and link.ranks == (slow_host,)
    # the pairs count by their receiver: no isend in what slowed, and the pair through the link in it
    assert {"p2p[0->2]", "p2p[2->0]"} <= set(link.evidence["slowed_groups"]), link.evidence
    assert not links.slow_links(*pipeline(None))  # healthy: every sender's isend as it was, nothing
