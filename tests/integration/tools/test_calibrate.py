"""`rankscope calibrate` with real gloo ranks: over two namespace hosts (collector.testing.netns) the
sweep measures the world, each host's ranks and the ranks across hosts, checks every collective's
result, and stores busbw per (op, size, span, group size) for that host set, which
collector.data.calibration reads back; with one host's link throttled the groups across hosts
measure the throttle's rate while the groups inside hosts do not. Bad arguments are refused
before anything is launched."""

from __future__ import annotations

import sys

import pytest

from collector.data import calibration
from collector.testing import multihost, netns
from collector.tools import cli

REASON = netns.unavailable()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"network namespaces: {REASON}")
HOSTS = ["host-0", "host-1"]


def sweep(tmp_path, sizes: str, iters: int, throttle=None):
    argv = [sys.executable, "-m", "collector.tools.calibrate", "--data-dir", str(tmp_path / "d")]
    argv += ["--sizes", sizes, "--iters", str(iters)]
    out = multihost.run_on_hosts(argv, hosts=2, ranks_per_host=2, throttle=throttle)
    stored = calibration.load(tmp_path / "d", HOSTS)
    assert stored is not None, out[0]
    return stored, out[0]


@needs_netns
@pytest.mark.timeout(300)
def test_a_small_sweep_over_two_hosts_stores_every_op_size_and_group_kind(tmp_path):
    stored, printed = sweep(tmp_path, "64K,256K", iters=2)
    assert "calibration of 2 host(s), 4 ranks" in printed
    kinds = {("intra", 2, 2), ("inter", 2, 2), ("inter", 4, 1)}  # each host's pair; the 2 pairs across; the world
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        for nbytes in (64 << 10, 256 << 10):
            got = stored[(stored.op == op) & (stored.bytes == nbytes)]
            assert {(r.span, r.group_size, r.groups) for r in got.itertuples()} == kinds, (op, nbytes, got)
    assert (stored.busbw_gbs > 0).all() and (stored.time_us > 0).all()
    assert set(stored.host_set) == {"host-0,host-1"}
    assert calibration.load(tmp_path / "d", ["host-0", "host-2"]) is None  # other hosts: no match


@needs_netns
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_throttled_link_shows_in_the_groups_across_hosts_only(tmp_path):
    stored, _ = sweep(tmp_path, "256K,1M,4M", iters=3, throttle=(1, "40mbit"))
    big = stored[stored.bytes == 4 << 20].set_index(["op", "span", "group_size"])
    # 40 Mbit/s is 0.005 GB/s; a pair across the link moves at most that per direction
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert big.loc[(op, "inter", 2), "busbw_gbs"] < 0.0055, big
        assert big.loc[(op, "intra", 2), "busbw_gbs"] > 4 * big.loc[(op, "inter", 2), "busbw_gbs"], big


@pytest.mark.parametrize(
    "args, why",
    [
        (["--sizes", "64Q"], "size '64Q'"),
        (["--ops", "all_reduce,gossip"], "gossip"),
        (["--nproc", "1"], "--nproc >= 2"),
        (["--iters", "0"], "--iters must be >= 1"),
    ],
)
def test_bad_arguments_are_named_and_nothing_runs(tmp_path, capsys, args, why):
    assert cli.main(["calibrate", "--data-dir", str(tmp_path / "d"), *args]) == 2
    assert why in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
