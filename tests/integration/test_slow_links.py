"""Slow links on real hosts: gloo ranks in network namespaces (collector.testing.netns), one
host's link throttled with tc tbf at a known step and restored at another, streaming into a real
collector in its own namespace; `findings.for_run` must name the link with its onset, its end and
what it cost, and keep quiet or blame the right thing otherwise.

Skipped where network namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import statistics
import sys

import pytest

from collector.data import calibration, findings, queries
from collector.data.retention import DELIVERY_MARGIN_STEPS
from collector.testing import multihost, netns

REASON = netns.unavailable()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"network namespaces: {REASON}"), pytest.mark.timeout(900)]


def found(run: multihost.HostsRun) -> list[findings.Finding]:
    cat = queries.Catalog(run.data_dir)
    try:
        return findings.for_run(cat, queries.resolve_run(cat.con, run.name))
    finally:
        cat.close()


def warnings(found_: list[findings.Finding]) -> list[findings.Finding]:
    """Warnings and worse, less a straggler `health` itself blames on host CPU contention: what an
    oversubscribed 2-core test host does to a rank (the fault suite's carve-out too)."""
    return [
        f
        for f in found_
        if f.severity in ("warning", "critical")
        and not (f.kind == "straggler" and f.evidence.get("cause") == "host_cpu")
    ]


def throttled_link_is_found(tmp_path, host: int, *, alone: bool, raw_every: int = 0) -> None:
    # loop index 20 (hook step 21: the optimizer's count starts at 1) to index 40 (step 41)
    run = multihost.train_on_hosts(
        tmp_path,
        hosts=2,
        ranks_per_host=2,
        steps=55,
        throttle=multihost.Throttle.parse(f"{host}:50mbit@20-40"),
        raw_every=raw_every,
    )
    slow, other = f"host-{host}", f"host-{1 - host}"
    cat = queries.Catalog(run.data_dir)
    hosts = set(queries.ranks(cat, queries.resolve_run(cat.con, run.name)).host)
    cat.close()
    assert hosts == {"host-0", "host-1"}  # each rank reports the host it ran on
    assert "tbf" in run.qdiscs[slow] and "tbf" not in run.qdiscs[other], run.qdiscs
    every = found(run)
    [link] = [f for f in every if f.kind == "slow_link"]
    # every group across 2 hosts spans both; the throttled host's telemetry, queued behind its
    # training traffic, arrived unevenly and names it alone. Never the other host alone; on a host
    # loaded past ~10 the unthrottled host's flushes jitter too and the tie can stay an "or" that
    # says so (2 of 10 runs here), which only the run that must name it alone (slow) refuses.
    if alone or len(link.evidence["hosts"]) == 1:
        assert link.evidence["hosts"] == [[slow]], link.text
        assert f"{slow}'s telemetry arrived unevenly" in link.text, link.text
    else:
        assert link.evidence["hosts"] == [["host-0"], ["host-1"]], link.text
        assert "the telemetry's arrival does not tell them apart" in link.text, link.text
    assert abs(link.evidence["onset_step"] - 21) <= 3, link.text
    assert link.evidence["detected_step"] - link.evidence["onset_step"] <= 10
    t = run.step_times
    rise_ms = 1e3 * (statistics.median(t[22:40]) - statistics.median(t[5:20]))
    assert rise_ms > 0
    end = link.evidence["end_step"]
    if end is not None and end < 41 - 3:
        # Beside a CPU hog the run once read "ended at step 33": the job's own step times must still
        # show the link's cost up to step 40 for that to be wrong (a CPU-starved job can fall below
        # what the throttled link carries, and then the link costs nothing).
        late_ms = 1e3 * (statistics.median(t[end + 1 : 40]) - statistics.median(t[5:20]))
        if late_ms < rise_ms / 2:
            pytest.skip(f"the job's steps {end + 2}-40 rose {late_ms:.0f} ms, under half the link's {rise_ms:.0f} ms")
    assert end is not None and abs(end - 41) <= 3, link.text
    assert link.cost_ms_per_step == pytest.approx(rise_ms, rel=0.25), (link.text, rise_ms)
    assert not [f for f in warnings(every) if f.kind != "slow_link"], [f.text for f in every]
    deliveries_kept_only_near(run, link, thinned=bool(raw_every))


def deliveries_kept_only_near(run: multihost.HostsRun, link: findings.Finding, *, thinned: bool) -> None:
    """With retention the run's telemetry arrival times stay only around the slow link's steps
    (what the tie-break above read); without it every flush of every rank stays."""
    cat = queries.Catalog(run.data_dir)
    try:
        run_id = queries.resolve_run(cat.con, run.name)
        steps = queries.deliveries(cat, run_id).groupby("rank").step
        last = int(queries.comm_rollup(cat, run_id)["step"].to_pandas().max())  # raw comm rows may be thinned
    finally:
        cat.close()
    first_kept, last_kept = link.steps[0] - DELIVERY_MARGIN_STEPS, link.steps[1] + DELIVERY_MARGIN_STEPS
    assert first_kept > 1 and last_kept < last, (link.steps, last)  # the run had flushes on either side
    if thinned:
        assert (steps.min() >= first_kept).all() and (steps.max() <= last_kept).all(), (steps.min(), steps.max())
    else:  # flushes from the start to the end of the run, every rank
        assert (steps.min() < first_kept).all() and (steps.max() > last_kept).all(), (steps.min(), steps.max())
    assert len(steps.size()) == 4 and (steps.size() >= 10).all()  # around the link: enough for its tie-break


@pytest.mark.timing  # the cost is checked against rank 0's measured step times
def test_a_throttled_link_between_two_hosts_is_found_with_onset_end_cost_and_its_host(tmp_path):
    # the first host: a mix-up with the last one would show; with retention (--raw-every), which
    # thins the telemetry's arrival times to those around the link
    throttled_link_is_found(tmp_path, 0, alone=False, raw_every=10)


@pytest.mark.slow
@pytest.mark.timing
def test_each_host_throttled_is_named_alone(tmp_path):
    throttled_link_is_found(tmp_path / "0", 0, alone=True, raw_every=10)  # on the deliveries retention kept
    throttled_link_is_found(tmp_path / "1", 1, alone=True)  # and on all of them


@pytest.mark.slow
def test_three_hosts_one_throttled_names_that_host(tmp_path):
    run = multihost.train_on_hosts(
        tmp_path, hosts=3, ranks_per_host=2, steps=50, throttle=multihost.Throttle.parse("1:50mbit@20")
    )
    every = found(run)
    [link] = [f for f in every if f.kind == "slow_link"]
    assert "tbf" in run.qdiscs["host-1"] and not any("tbf" in run.qdiscs[h] for h in ("host-0", "host-2"))
    assert link.evidence["hosts"] == [["host-1"]], link.text  # the middle one: not the last host started
    assert abs(link.evidence["onset_step"] - 21) <= 3 and link.evidence["end_step"] is None
    assert not [f for f in warnings(every) if f.kind != "slow_link"], [f.text for f in every]


@pytest.mark.slow
def test_an_unthrottled_run_over_hosts_has_no_warning(tmp_path):
    run = multihost.train_on_hosts(tmp_path, hosts=2, ranks_per_host=2, steps=50)
    assert not warnings(found(run)), [f.text for f in found(run)]


@pytest.mark.slow
def test_a_compute_straggler_over_hosts_is_a_straggler_not_a_link(tmp_path):
    run = multihost.train_on_hosts(
        tmp_path, hosts=2, ranks_per_host=2, steps=50, workload_args=("--fault", "sleep:3:60@15")
    )
    every = found(run)
    assert not [f for f in every if f.kind == "slow_link"], [f.text for f in every]
    assert [f.ranks for f in every if f.kind == "straggler"] == [(3,)], [f.text for f in every]


@pytest.mark.slow
def test_a_link_slow_from_the_start_is_found_only_against_a_calibration_of_the_hosts(tmp_path):
    # rankscope calibrate on the same two hosts first (its sizes around the workload's 512 KiB)
    sweep = [sys.executable, "-m", "collector.tools.calibrate", "--data-dir", str(tmp_path / "data")]
    multihost.run_on_hosts([*sweep, "--sizes", "256K,512K,1M", "--ops", "all_reduce"], hosts=2, ranks_per_host=2)
    run = multihost.train_on_hosts(
        tmp_path, hosts=2, ranks_per_host=2, steps=40, throttle=multihost.Throttle.parse("1:50mbit@0")
    )
    every = found(run)
    [link] = [f for f in every if f.kind == "slow_link"]
    assert link.evidence["expected_from"] == "calibration" and link.evidence["hosts"] == [["host-1"]], link.text
    assert link.evidence["end_step"] is None
    assert not [f for f in warnings(every) if f.kind != "slow_link"], [f.text for f in every]
    # the same run judged by what it learned itself: slow all along is its normal
    calibration.path(run.data_dir, ["host-0", "host-1"]).unlink()
    assert not [f for f in found(run) if f.kind == "slow_link"]


# The world group only, as most jobs are written (issue 43): plain DDP or FSDP2 over every rank, no
# group inside a host to compare with; every collective spans every host and slows alike.
WORLD_ARGS = ("--width", "256", "--layers", "8")  # ~2 MiB of gradients: a link at 80 Mbit/s shows


def train_world(tmp_path, *, hosts: int, ranks_per_host: int, steps: int, mode: str = "ddp", **kwargs):
    args = ("--mode", mode, *WORLD_ARGS, *kwargs.pop("workload_args", ()))
    return multihost.train_on_hosts(
        tmp_path,
        hosts=hosts,
        ranks_per_host=ranks_per_host,
        steps=steps,
        workload=multihost.WORLD_WORKLOAD,
        workload_args=args,
        **kwargs,
    )


def world_link_is_found(run: multihost.HostsRun, throttle: multihost.Throttle, *, hosts: int) -> findings.Finding:
    """A network slowdown with its size and onset, the throttled host named alone or among an honest
    "or" of every host that could be it (never another host alone), and no rank blamed."""
    slow = f"host-{throttle.host}"
    assert "tbf" in run.qdiscs[slow], run.qdiscs
    every = found(run)
    [link] = [f for f in every if f.kind == "slow_link"]
    assert link.evidence["control"] == "compute", link.text  # no group inside a host to compare with
    named = link.evidence["hosts"]
    assert [slow] in named and all(len(c) == 1 for c in named), link.text
    if len(named) > 1:  # every host that could be it, and the sentence says why none is chosen
        assert sorted(h for [h] in named) == [f"host-{h}" for h in range(hosts)], link.text
        assert "does not tell them apart" in link.text or "too few telemetry flushes" in link.text, link.text
    onset = throttle.from_step + 1  # the hook's steps count from 1
    assert abs(link.evidence["onset_step"] - onset) <= 3, link.text
    assert link.evidence["detected_step"] - onset <= 10, link.text
    assert link.evidence["factor"] > 2 and link.evidence["after_gbs"] < link.evidence["before_gbs"], link.text
    t = run.step_times
    rise_ms = 1e3 * (statistics.median(t[throttle.from_step + 2 :]) - statistics.median(t[5 : throttle.from_step]))
    assert link.cost_ms_per_step == pytest.approx(rise_ms, rel=0.35), (link.text, rise_ms)
    # no rank is blamed for the network: no straggler, whatever its cause
    assert not [f for f in every if f.kind == "straggler"], [f.text for f in every]
    assert not [f for f in warnings(every) if f.kind != "slow_link"], [f.text for f in every]
    return link


@pytest.mark.timing  # the cost is checked against rank 0's measured step times
def test_plain_ddp_over_the_world_one_rank_a_host_a_throttled_link_is_the_network_not_a_straggler(tmp_path):
    # issue 43's case: 3 hosts, one rank each, the world group only, host-1's link at 80 Mbit/s
    throttle = multihost.Throttle.parse("1:80mbit@15")
    run = train_world(tmp_path, hosts=3, ranks_per_host=1, steps=35, throttle=throttle)
    world_link_is_found(run, throttle, hosts=3)


@pytest.mark.slow
@pytest.mark.timing
def test_plain_ddp_over_the_world_four_ranks_a_host(tmp_path):
    throttle = multihost.Throttle.parse("1:80mbit@20")
    run = train_world(tmp_path, hosts=2, ranks_per_host=4, steps=45, throttle=throttle)
    world_link_is_found(run, throttle, hosts=2)


@pytest.mark.slow
@pytest.mark.timing
def test_fsdp2_over_the_world_a_throttled_link_is_the_network(tmp_path):
    throttle = multihost.Throttle.parse("0:120mbit@20")
    run = train_world(tmp_path, hosts=2, ranks_per_host=2, steps=45, mode="fsdp2", throttle=throttle)
    world_link_is_found(run, throttle, hosts=2)


@pytest.mark.slow
def test_plain_ddp_over_the_world_escalation_profiles_no_healthy_rank(tmp_path):
    # the collector's automatic evidence on (as `rankscope collect` runs by default): nothing it
    # asks for may come of a straggler finding; the slow link's own capture names no rank off its hosts
    throttle = multihost.Throttle.parse("1:80mbit@15")
    run = train_world(tmp_path, hosts=3, ranks_per_host=1, steps=45, throttle=throttle, auto_profile=True)
    cat = queries.Catalog(run.data_dir)
    try:
        asked = cat.df(
            "SELECT finding, role, rank FROM artifacts WHERE run_id = ?", [queries.resolve_run(cat.con, run.name)]
        )
    finally:
        cat.close()
    assert not asked.finding.fillna("").str.contains("arriving late").any(), asked.to_string()
    [link] = [f for f in found(run) if f.kind == "slow_link"]
    assert [f"host-{throttle.host}"] in link.evidence["hosts"], link.text


@pytest.mark.slow
@pytest.mark.parametrize("mode,hosts,ranks_per_host", [("ddp", 3, 1), ("ddp", 2, 4), ("fsdp2", 2, 2)])
def test_a_healthy_run_over_the_world_group_has_no_warning(tmp_path, mode, hosts, ranks_per_host):
    run = train_world(tmp_path, hosts=hosts, ranks_per_host=ranks_per_host, steps=40, mode=mode)
    assert not warnings(found(run)), [f.text for f in found(run)]


@pytest.mark.slow
def test_a_compute_straggler_over_the_world_group_stays_a_straggler_not_a_link(tmp_path):
    run = train_world(tmp_path, hosts=3, ranks_per_host=1, steps=45, workload_args=("--fault", "sleep:2:60@15"))
    every = found(run)
    assert not [f for f in every if f.kind == "slow_link"], [f.text for f in every]
    assert [f.ranks for f in every if f.kind == "straggler"] == [(2,)], [f.text for f in every]


@pytest.mark.slow
def test_plain_ddp_over_the_world_a_link_that_flaps_is_one_network_finding(tmp_path):
    # host-1's link at 80 Mbit/s for 5 loop indexes of every 20, three times (steps 16-20, 36-40, 56-60)
    throttles = multihost.Throttle.parse_all("1:80mbit@15-20,1:80mbit@35-40,1:80mbit@55-60")
    run = train_world(tmp_path, hosts=3, ranks_per_host=1, steps=70, throttle=throttles)
    every = found(run)
    [link] = [f for f in every if f.kind == "slow_link"]
    assert ["host-1"] in link.evidence["hosts"], link.text
    named = {h for c in link.evidence["hosts"] for h in c}
    assert set(link.ranks) == {r for r in range(3) if f"host-{r}" in named}, (link.ranks, link.text)
    episodes = link.evidence.get("episodes") or [[link.evidence["onset_step"], link.evidence["end_step"]]]
    # every flap found within 10 steps of its onset, each told inside one finding
    for t in throttles:
        onset = t.from_step + 1  # the hook's steps count from 1
        assert any(abs(o - onset) <= 3 for o, _ in episodes), (episodes, link.text)
    assert link.evidence["detected_step"] - (throttles[0].from_step + 1) <= 10, link.text
    assert not [f for f in every if f.kind == "straggler"], [f.text for f in every]
    assert not [f for f in warnings(every) if f.kind != "slow_link"], [f.text for f in every]


@pytest.mark.slow
def test_plain_ddp_over_the_world_two_links_slow_at_once(tmp_path):
    # 4 hosts, one rank each; host-1 and host-2 at 80 Mbit/s from loop index 15
    throttles = multihost.Throttle.parse_all("1:80mbit@15,2:80mbit@15")
    run = train_world(tmp_path, hosts=4, ranks_per_host=1, steps=40, throttle=throttles)
    every = found(run)
    [link] = [f for f in every if f.kind == "slow_link"]
    named = link.evidence["hosts"]
    # both named (as one pair), or an honest "or" that holds both; never a healthy host alone
    assert named == [["host-1", "host-2"]] or (["host-1"] in named and ["host-2"] in named), link.text
    assert abs(link.evidence["onset_step"] - 16) <= 3 and link.evidence["detected_step"] - 16 <= 10, link.text
    assert not [f for f in every if f.kind == "straggler"], [f.text for f in every]


@pytest.mark.slow
def test_plain_ddp_over_the_world_a_link_slow_from_the_start_is_found_only_against_a_calibration(tmp_path):
    # rankscope calibrate on the same 3 hosts first (the world group, around DDP's ~1-2 MiB buckets)
    sweep = [sys.executable, "-m", "collector.tools.calibrate", "--data-dir", str(tmp_path / "data")]
    multihost.run_on_hosts([*sweep, "--sizes", "1M,2M,4M", "--ops", "all_reduce"], hosts=3, ranks_per_host=1)
    throttle = multihost.Throttle.parse("1:80mbit@0")
    run = train_world(tmp_path, hosts=3, ranks_per_host=1, steps=40, throttle=throttle)
    every = found(run)
    [link] = [f for f in every if f.kind == "slow_link"]
    assert link.evidence["control"] == "calibration" and link.evidence["expected_from"] == "calibration", link.text
    assert ["host-1"] in link.evidence["hosts"] and link.evidence["end_step"] is None, link.text
    assert link.evidence["onset_step"] <= 5, link.text
    assert not [f for f in warnings(every) if f.kind != "slow_link"], [f.text for f in every]
    # judged by what it learned itself, slow all along is its normal: nothing (and no straggler)
    calibration.path(run.data_dir, ["host-0", "host-1", "host-2"]).unlink()
    assert not [f for f in warnings(found(run))], [f.text for f in found(run)]


@pytest.mark.slow
def test_plain_ddp_over_the_world_healthy_under_cpu_load_from_mid_run_names_no_link(tmp_path):
    # 3 hosts x 1 rank, no throttle; from loop index 20 four busy loops ahead of the ranks (nice -10)
    # share the machine's 2 cores: gloo's transfers slow (~1.8x) while DDP hides the compute under
    # them, so the busy time stays put and 2 runs of 4 read as a slow link until the ranks' wait for
    # a CPU was asked too (it rose 30-50 ms a step): the hosts, not a link
    def hog(net) -> None:
        for _ in range(4):
            net.popen(net.hosts[0], ["nice", "-n", "-10", sys.executable, "-c", "while True: pass"])

    # a wider model, so a step computes for a while (the load slows what the CPU does)
    run = train_world(
        tmp_path, hosts=3, ranks_per_host=1, steps=45, at_steps={20: hog}, workload_args=("--width", "768")
    )
    t = run.step_times
    if statistics.median(t[22:]) < 1.2 * statistics.median(t[5:20]):
        pytest.skip(f"the load did not slow the steps (median {t[5:20]} -> {t[22:]}): nothing was tried")
    every = found(run)
    assert not warnings(every), [f.text for f in every]  # silent: no link, no straggler


def _deepspeed_rank_side() -> tuple[str, dict]:
    from benches import _deepspeed_venv

    have = _deepspeed_venv.versions()
    if not have or have["deepspeed"] != _deepspeed_venv.DEEPSPEED:
        pytest.skip(f"DeepSpeed {_deepspeed_venv.DEEPSPEED} is not in {_deepspeed_venv.VENV} (make ds-venv)")
    return str(_deepspeed_venv.PYTHON), _deepspeed_venv.ensure_rank_side()


@pytest.mark.slow
@pytest.mark.timing
def test_deepspeed_zero2_under_the_hook_a_throttled_link_is_the_network_and_healthy_is_silent(tmp_path):
    # real DeepSpeed 0.19.8 (DS_ACCELERATOR=cpu, gloo) with the hook attached, 2 hosts x 2 ranks: its
    # own data-parallel group over every rank, bucketed all_reduces and all_gathers
    python, env = _deepspeed_rank_side()
    throttle = multihost.Throttle.parse("0:120mbit@15")
    run = train_world(
        tmp_path / "slow", hosts=2, ranks_per_host=2, steps=40, mode="zero2", throttle=throttle, python=python,
        rank_env=env,
    )  # fmt: skip
    world_link_is_found(run, throttle, hosts=2)
    calm = train_world(tmp_path / "calm", hosts=2, ranks_per_host=2, steps=40, mode="zero2", python=python,
                       rank_env=env)  # fmt: skip
    assert not warnings(found(calm)), [f.text for f in found(calm)]


def train_pipeline(
    work, *, hosts: int, ranks_per_host: int, throttle=None, fault: str = "", deepspeed: bool = False, tp: int = 1
) -> multihost.HostsRun:
    """A pipeline over namespace hosts (pipe_train.py): 2 stages across hosts, on the bundled engine
    (``tp`` > 1: tensor-parallel layers in each stage) or (``deepspeed``) DeepSpeed's own
    PipelineEngine in its venv."""
    python, env = _deepspeed_rank_side() if deepspeed else (sys.executable, None)
    args = ("--stages", "2", *(("--fault", fault) if fault else ()), *(("--engine", "deepspeed") if deepspeed else ()))
    args += ("--tp", str(tp)) if tp > 1 else ()
    return multihost.train_on_hosts(
        work, hosts=hosts, ranks_per_host=ranks_per_host, steps=40, name="pipe", throttle=throttle,
        workload=multihost.PIPE_WORKLOAD, workload_args=args, python=python, rank_env=env,
    )  # fmt: skip


@pytest.mark.timing  # in make test: the pipeline's pairs and stage groups on real links (~35 s)
def test_a_pipeline_over_four_hosts_names_the_slow_host_by_its_stage_groups_and_pairs(tmp_path):
    # 2 stages x 2 replicas, 1 rank a host: each stage's data-parallel all_reduce crosses 2 hosts, each
    # replica's activations and gradients cross 2 others; host-2 (stage 1, replica 0) at 80 Mbit/s from
    # loop index 15 (the engine's step 15)
    run = train_pipeline(tmp_path / "slow", hosts=4, ranks_per_host=1, throttle=multihost.Throttle.parse("2:80mbit@15"))
    every = found(run)
    [link] = [f for f in every if f.kind == "slow_link"]
    assert link.evidence["hosts"] == [["host-2"]], link.text
    # two steps of slack before the throttle: the episode's first alarm can be a noisy step just before
    # it that the rule merges into the episode (fresh clones read 14 and 13, onset 13, on 2026-11-29)
    assert 13 <= link.evidence["detected_step"] <= 25, link.evidence
    assert {"dp[2-3]", "p2p[0->2]"} <= set(link.evidence["slowed_groups"]), link.evidence
    # the stage slowed by its link is no straggler, no long last stage of the what-if replay
    assert not [f for f in warnings(every) if f.kind != "slow_link"], [f.text for f in every]
    times = run.step_times
    rise_ms = 1e3 * (statistics.median(times[18:]) - statistics.median(times[3:15]))
    assert link.cost_ms_per_step == pytest.approx(rise_ms, rel=0.5), (link.cost_ms_per_step, rise_ms)


@pytest.mark.slow
@pytest.mark.timing
def test_a_healthy_pipeline_over_hosts_is_silent_and_a_compute_straggler_stays_one(tmp_path):
    calm = found(train_pipeline(tmp_path / "calm", hosts=4, ranks_per_host=1))
    assert not warnings(calm), [f.text for f in calm]
    late = found(train_pipeline(tmp_path / "late", hosts=4, ranks_per_host=1, fault="sleep:1:60@15"))
    assert [(f.kind, f.ranks) for f in warnings(late)] == [("straggler", (1,))], [f.text for f in late]


@pytest.mark.slow
@pytest.mark.timing
def test_deepspeeds_pipeline_engine_over_hosts_the_slow_host_is_named_alone(tmp_path):
    # the same script on DeepSpeed 0.19.8's PipelineEngine under the hook: its p2p and data-parallel
    # all_reduce as the hook records them; host-0 (stage 0, replica 0) at 80 Mbit/s from loop index 15
    throttle = multihost.Throttle.parse("0:80mbit@15")
    every = found(train_pipeline(tmp_path / "slow", hosts=4, ranks_per_host=1, throttle=throttle, deepspeed=True))
    [link] = [f for f in every if f.kind == "slow_link"]
    assert link.evidence["hosts"] == [["host-0"]], link.text
    assert not [f for f in warnings(every) if f.kind != "slow_link"], [f.text for f in every]
    calm = found(train_pipeline(tmp_path / "calm", hosts=4, ranks_per_host=1, deepspeed=True))
    assert not warnings(calm), [f.text for f in calm]


@pytest.mark.slow
@pytest.mark.timing
def test_3d_parallel_tp_inside_each_host_pp_and_dp_across_the_slow_host_is_named_alone(tmp_path):
    # PP 2 x TP 2 x DP 2 on 4 hosts of 2 ranks (the Megatron layout: a TP pair is a host, stage 0 on
    # hosts 0-1, stage 1 on hosts 2-3, pipelines and replicas across hosts); host-1 (stage 0, replica
    # 1) at 80 Mbit/s from loop index 15. Its TP all_reduces never leave the host: the groups inside
    # hosts are the control, the link is host-1's, and nothing else warns
    throttle = multihost.Throttle.parse("1:80mbit@15")
    every = found(train_pipeline(tmp_path / "slow", hosts=4, ranks_per_host=2, throttle=throttle, tp=2))
    [link] = [f for f in every if f.kind == "slow_link"]
    assert link.evidence["hosts"] == [["host-1"]], link.text
    assert not {"tp[0-1]", "tp[2-3]", "tp[4-5]", "tp[6-7]"} & set(link.evidence["slowed_groups"]), link.evidence
    assert not [f for f in warnings(every) if f.kind != "slow_link"], [f.text for f in every]
    calm = found(train_pipeline(tmp_path / "calm", hosts=4, ranks_per_host=2, tp=2))
    assert not warnings(calm), [f.text for f in calm]
