"""``rankscope probe`` and ``collect --auto-probe`` on real hosts: FSDP2 over the world group, 2
namespace hosts x 2 gloo ranks streaming to a real collector in a third namespace (the case whose
slow-link finding the telemetry leaves an "or"). Before the throttle, ``rankscope probe`` (the CLI,
in the collector's namespace) times every path and names no link; host-0's link then goes to
120 Mbit/s with tc tbf, the collector's escalation probes the hosts the finding leaves in doubt on
its own, and the finding names host-0 alone from that probe, with no straggler.

Skipped where network namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from collector.data import findings, queries
from collector.testing import multihost, netns

REASON = netns.unavailable()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"network namespaces: {REASON}"), pytest.mark.timeout(900)]

HEALTHY_PROBE_AT, THROTTLE_AT, STEPS = 10, 20, 55


@pytest.mark.timing  # a namespace run: served alone, as the other slow-link tests
def test_a_probe_names_no_link_when_healthy_and_the_auto_probe_settles_the_fsdp2_or(tmp_path):
    out = tmp_path / "probe.out"
    data = tmp_path / "run" / "data"

    cli = []

    def probe_now(net: netns.Network) -> None:  # the CLI, as a user runs it, beside the training
        endpoint = f"{net.ip('collector')}:{multihost.COLLECTOR_PORT}"
        argv = [sys.executable, "-m", "collector.tools.cli", "probe", "hosts", "--endpoint", endpoint]
        cli.append(net.popen("collector", [*argv, "--data-dir", str(data)], stdout=out.open("w"),
                             stderr=subprocess.STDOUT, cwd=multihost.REPO))  # fmt: skip

    def probe_done(net: netns.Network) -> None:
        # the healthy probe is over before the throttle: on a loaded host the CLI's start alone took
        # 9 steps, and its last pair was timed through the throttled link
        cli[0].wait(timeout=300)

    run = multihost.train_on_hosts(
        tmp_path / "run",
        hosts=2,
        ranks_per_host=2,
        steps=STEPS,
        workload=multihost.WORLD_WORKLOAD,
        workload_args=("--mode", "fsdp2", "--width", "256", "--layers", "8"),
        throttle=multihost.Throttle.parse(f"0:120mbit@{THROTTLE_AT}"),
        at_steps={HEALTHY_PROBE_AT: probe_now, THROTTLE_AT - 1: probe_done},
        auto_probe=True,
    )
    said = out.read_text()
    assert "hosts: host-0 (rank 0), host-1 (rank 2); and the collector" in said, said
    assert "verdict: no link stands out" in said, said
    for path in ("host-0 -> host-1", "host-1 -> host-0", "host-0 -> the collector", "the collector -> host-1"):
        assert path in said, said

    cat = queries.Catalog(run.data_dir)
    try:
        run_id = queries.resolve_run(cat.con, run.name)
        probes = queries.probes(cat, run_id)
        every = findings.for_run(cat, run_id)
    finally:
        cat.close()
    measured = probes[probes.status == "measured"]
    assert measured.request_id.nunique() == 2, probes  # the CLI's, then the collector's own
    # each probe: 3 pairs (host-0/host-1, each host and the collector), both ways
    assert (measured.groupby("request_id").size() == 6).all(), measured
    assert (measured.mbit_s > 0).all(), measured
    early, late = sorted(measured.request_id.unique(), key=lambda r: measured[measured.request_id == r].step.min())
    assert measured[measured.request_id == early].step.max() < THROTTLE_AT + 1
    assert measured[measured.request_id == late].step.min() > THROTTLE_AT + 1

    links = [f for f in every if f.kind == "slow_link"]
    assert len(links) == 1, [(f.kind, f.text, f.evidence) for f in every]
    [link] = links
    assert link.evidence["hosts"] == [["host-0"]], link.text
    assert link.evidence["probe"] == late and "a link probe while it lasted" in link.text, link.text
    assert "host-0's link is slow both ways" in link.text, link.text
    assert link.ranks == (0, 1)
    assert abs(link.evidence["onset_step"] - (THROTTLE_AT + 1)) <= 3, link.text
    assert not [f for f in every if f.kind == "straggler"], [f.text for f in every]
