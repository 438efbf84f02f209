"""Which host's link a link probe names (collector.data.findings.probes): the end of every slow path
against the fastest path without it, both ways or one; silent on healthy paths, honest with only
two ends, no link when most ends are slow; and the probe taken while a slowdown lasted."""

from __future__ import annotations

import pandas as pd

from collector.data.findings.probes import COLLECTOR, during, judge, rates

FAST, SLOW = 9000.0, 90.0
HOSTS = ("host-0", "host-1", "host-2")


def paths(ends, slow=(), sending_only=(), noise=0.1):
    """Every ordered pair of ``ends``: FAST, SLOW through a ``slow`` end (or from a ``sending_only`` one)."""
    out = {}
    for i, a in enumerate(ends):
        for j, b in enumerate(ends):
            if a == b:
                continue
            slowed = a in slow or b in slow or a in sending_only
            out[(a, b)] = (SLOW if slowed else FAST) * (1 + noise * ((i + 2 * j) % 3 - 1))
    return out


def test_the_host_on_every_slow_path_is_named_alone_both_ways():
    v = judge(paths([*HOSTS, COLLECTOR], slow=["host-1"]))
    assert v.hosts == ("host-1",) and v.ways == {"host-1": "both ways"}
    assert "host-1's link is slow both ways" in v.sentence


def test_two_hosts_and_the_collector_as_third_end_tell_the_side():
    v = judge(paths(["host-0", "host-1", COLLECTOR], slow=["host-0"]))
    assert v.hosts == ("host-0",)


def test_a_link_slow_one_way_is_named_with_its_side():
    v = judge(paths([*HOSTS, COLLECTOR], sending_only=["host-2"]))
    assert v.hosts == ("host-2",) and v.ways == {"host-2": "sending"}


def test_two_slow_links_at_once_are_both_named():
    v = judge(paths(["host-0", "host-1", "host-2", "host-3", COLLECTOR], slow=["host-1", "host-3"]))
    assert v.hosts == ("host-1", "host-3")


def test_healthy_paths_name_nothing():
    v = judge(paths([*HOSTS, COLLECTOR], noise=0.3))
    assert v.hosts == () and "no link stands out" in v.sentence


def test_only_two_ends_cannot_tell_which_side():
    v = judge(paths(["host-0", "host-1"], slow=["host-0"]))
    assert v.hosts == () and "no third end" in v.sentence


def test_most_ends_slow_is_no_link():
    v = judge(paths(["host-0", "host-1", "host-2", "host-3", COLLECTOR], slow=["host-0", "host-1", "host-2"]))
    assert v.hosts == () and "most paths are slow" in v.sentence and "not one link" in v.sentence
    # every path touching a slow host alike: nothing is faster than another, so nothing stands out
    assert judge(paths(["host-0", "host-1", COLLECTOR], slow=["host-0", "host-1"])).hosts == ()


def test_a_healthy_probe_beside_training_reads_within_its_noise():
    # measured: 2 namespace hosts x 2 FSDP2 ranks training, no throttle, 4 MiB each way per path
    measured = {
        ("host-0", "host-1"): 4117.2,
        ("host-0", COLLECTOR): 17228.4,
        ("host-1", "host-0"): 7879.6,
        ("host-1", COLLECTOR): 16591.8,
        (COLLECTOR, "host-0"): 4646.0,
        (COLLECTOR, "host-1"): 7078.6,
    }
    v = judge(measured)
    assert v.hosts == () and v.sentence.startswith("no link stands out"), v.sentence


def test_the_collectors_own_slow_link_names_no_host():
    v = judge(paths([*HOSTS, COLLECTOR], slow=[COLLECTOR]))
    assert v.hosts == () and "the collector's own link" in v.sentence


def _rows(request_id, step, host_rates, time_ns=0):
    """probes rows as ranks write them: per (host, peer, peer_rank) both directions at one rate."""
    rows = []
    for (host, peer, peer_rank), mbit in host_rates.items():
        for direction in ("send", "receive"):
            rows.append(dict(request_id=request_id, status="measured", step=step, host=host, peer_host=peer,
                             peer_rank=peer_rank, direction=direction, mbit_s=mbit, time_ns=time_ns))  # fmt: skip
    return rows


def test_rates_turn_a_ranks_rows_into_directed_paths():
    rows = pd.DataFrame(
        [
            dict(host="a", peer_host="b", peer_rank=1, direction="send", mbit_s=10.0),
            dict(host="a", peer_host="b", peer_rank=1, direction="receive", mbit_s=20.0),
            dict(host="a", peer_host="ctl", peer_rank=-1, direction="send", mbit_s=30.0),
        ]
    )
    assert rates(rows) == {("a", "b"): 10.0, ("b", "a"): 20.0, ("a", COLLECTOR): 30.0}


def test_during_takes_the_latest_decisive_probe_inside_the_slowdown_among_the_candidates():
    slow0 = {("host-0", "host-1", 2): SLOW, ("host-0", "c", -1): SLOW, ("host-1", "c", -1): FAST}
    healthy = {("host-0", "host-1", 2): FAST, ("host-0", "c", -1): FAST, ("host-1", "c", -1): FAST}
    probes = pd.DataFrame(_rows("before", 5, slow0, 1) + _rows("inside", 30, slow0, 2) + _rows("calm", 32, healthy, 3))
    request_id, verdict = during(probes, ["host-0", "host-1"], [(20, 40)])
    assert request_id == "inside" and verdict.hosts == ("host-0",)
    assert during(probes, ["host-0", "host-1"], [(40, 60)]) is None  # none while it lasted
    assert during(probes, ["host-1", "host-2"], [(20, 40)]) is None  # it names a host outside the "or"
    assert during(None, ["host-0"], [(0, 9)]) is None
