"""Several "hosts" on one machine: Linux network namespaces joined through a bridge, each
host's link rate set (and changed mid-run) with ``tc qdisc ... tbf``.

    reason = netns.unavailable()            # None, or why namespaces cannot be made here
    with netns.Network(hosts=2) as net:     # namespaces host-0, host-1, collector, bridge
        proc = net.popen("collector", [...])            # a process inside a namespace
        net.popen(net.hosts[1], [...], hostname="host-1")
        net.throttle("host-1", rate="40mbit")           # both directions of host-1's link
        net.restore("host-1")
        net.partition("collector")                      # every packet on its link dropped
        net.heal("collector")

Topology: one namespace per member (each host, and the collector), each with one interface
``eth0`` (a veth) at 10.99.0.<i+1>/24, whose peer sits in a bridge namespace on bridge ``br0``.
Traffic between two ranks of one host stays inside its namespace; traffic between hosts
crosses its sender's veth, the bridge, and its receiver's veth. Nothing is put in the
caller's namespace but the veths' names for the instant they are created, so no packet
of a test leaves the namespaces it made.

A host's "link" is its veth pair: ``throttle`` puts a tbf on both ends (egress of eth0 is
what the host sends, egress of the bridge-side peer what it receives). ``netem`` is not
needed (and not on every kernel); tbf is.

``partition`` cuts a member off as a real partition does: its connections *hang* (packets vanish,
TCP retransmits, a new connect times out) rather than being refused. Both ends of its link get a
``pfifo`` of length 0 (every packet dropped, in both directions), and first every member's
neighbour entry for the others is pinned (``nud permanent``), so no failed ARP turns the silence
into an immediate "no route to host" as it would on one LAN.

Processes are started with ``ip netns exec NS unshare --uts`` and, given ``hostname``, set
their namespace's host name first, so a rank's ``socket.gethostname()`` (what it reports in
its Hello, and how ranks group by host) is the simulated host's.

Teardown (leaving the block, also on an exception): every process still running in the
namespaces is killed (SIGKILL, by pid: ``ip netns pids``), then the namespaces are deleted,
which removes their veths and the bridge. Needs root (CAP_NET_ADMIN) and iproute2's ``ip``
and ``tc``; ``unavailable()`` says why not, for a test's skip reason.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

SUBNET = "10.99.0"  # private, and only ever inside the namespaces made here
BRIDGE = "br0"


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed; the message carries the command and its stderr."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why network namespaces cannot be used here (None when they can): checked by making one."""
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); this test runs as uid " + str(os.geteuid())
    probe = f"rsprobe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


class Network:
    """``hosts`` host namespaces (named ``host-0`` ...) and a ``collector`` namespace on one bridge."""

    def __init__(self, hosts: int) -> None:
        if hosts < 1:
            raise ValueError(f"hosts must be >= 1, got {hosts}")
        self.tag = f"rs{secrets.token_hex(3)}"  # veth names: at most 15 characters
        self.hosts = [f"host-{h}" for h in range(hosts)]
        self.members = [*self.hosts, "collector"]
        self.bridge_ns = f"{self.tag}-bridge"
        self._procs: list[subprocess.Popen] = []

    # ---- names ---------------------------------------------------------------------------
    def ns(self, member: str) -> str:
        return f"{self.tag}-{member}"

    def ip(self, member: str) -> str:
        return f"{SUBNET}.{self.members.index(member) + 1}"

    def _peer(self, member: str) -> str:
        return f"{self.tag}p{self.members.index(member)}"

    # ---- life ------------------------------------------------------------------------------
    def __enter__(self) -> Network:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        _run("ip", "netns", "add", self.bridge_ns)
        _run("ip", "-n", self.bridge_ns, "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "-n", self.bridge_ns, "link", "set", BRIDGE, "up")
        for i, member in enumerate(self.members):
            ns, inner, peer = self.ns(member), f"{self.tag}e{i}", self._peer(member)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", peer, "netns", self.bridge_ns)
            _run("ip", "-n", ns, "link", "set", inner, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{self.ip(member)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", self.bridge_ns, "link", "set", peer, "master", BRIDGE)
            _run("ip", "-n", self.bridge_ns, "link", "set", peer, "up")

    def close(self) -> None:
        """Kill what runs in the namespaces, then delete them (idempotent)."""
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in [*map(self.ns, self.members), self.bridge_ns]:
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()

    # ---- processes ------------------------------------------------------------------------
    def popen(self, member: str, argv: list[str], *, hostname: str | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside ``member``'s namespace (in its own UTS namespace, named
        ``hostname`` when given) and its own process group; killed at teardown."""
        wrapped = ["ip", "netns", "exec", self.ns(member), "unshare", "--uts", "--"]
        if hostname:
            wrapped += ["sh", "-c", 'hostname "$0" && exec "$@"', hostname]
        proc = subprocess.Popen(wrapped + list(argv), start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    # ---- link rates -------------------------------------------------------------------------
    def throttle(self, host: str, *, rate: str, burst: str = "64kb", latency: str = "100ms") -> None:
        """Both directions of ``host``'s link at ``rate`` (tc's units: '40mbit', '5mbps')."""
        for ns, dev in ((self.ns(host), "eth0"), (self.bridge_ns, self._peer(host))):
            _run(
                "ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root",
                "tbf", "rate", rate, "burst", burst, "latency", latency,
            )  # fmt: skip

    def restore(self, host: str) -> None:
        """``host``'s link at full speed again."""
        for ns, dev in ((self.ns(host), "eth0"), (self.bridge_ns, self._peer(host))):
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)

    def partition(self, member: str) -> None:
        """Every packet to and from ``member`` dropped, in both directions, until ``heal``."""
        self._pin_neighbours()
        for ns, dev in ((self.ns(member), "eth0"), (self.bridge_ns, self._peer(member))):
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "pfifo", "limit", "0")

    def heal(self, member: str) -> None:
        """``member``'s link carries packets again (the same as ``restore``)."""
        self.restore(member)

    def _pin_neighbours(self) -> None:
        macs = {m: self._mac(m) for m in self.members}
        for member in self.members:
            for other in self.members:
                if other != member:
                    _run("ip", "-n", self.ns(member), "neigh", "replace", self.ip(other),
                         "lladdr", macs[other], "dev", "eth0", "nud", "permanent")  # fmt: skip

    def _mac(self, member: str) -> str:
        return _run("ip", "-n", self.ns(member), "-br", "link", "show", "eth0").stdout.split()[2]  # eth0 UP <mac> ...

    def qdisc(self, host: str) -> str:
        """``tc qdisc show`` of ``host``'s eth0 (for a test's evidence)."""
        return _run("ip", "netns", "exec", self.ns(host), "tc", "qdisc", "show", "dev", "eth0").stdout


class StepControl:
    """Actions at given training steps, in lock-step with the ranks, never on a timer.

    A rank that reaches a step in ``actions`` (collector/testing/workloads/hosts_train.py,
    ``--control DIR --pause-at K,...``) writes ``DIR/request-K`` (rank 0) and every rank waits
    for ``DIR/ack-K``; this thread sees the request, runs the step's action (say, throttle a
    link) and writes the ack. So the link is slow from exactly step K on, however loaded the
    machine. ``done`` lists the steps acted on; ``error`` holds an action's exception."""

    def __init__(self, control_dir: Path, actions: dict[int, Callable[[], None]]) -> None:
        self.dir = Path(control_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.actions = dict(actions)
        self.done: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rankscope-step-control", daemon=True)

    @property
    def pause_at(self) -> str:
        return ",".join(str(k) for k in sorted(self.actions))

    def __enter__(self) -> StepControl:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        pending = sorted(self.actions)
        while pending and not self._stop.is_set():
            step = pending[0]
            if (self.dir / f"request-{step}").exists():
                try:
                    self.actions[step]()
                except BaseException as exc:  # handed to the test
                    self.error = exc
                self.done.append(step)
                (self.dir / f"ack-{step}").write_text(str(time.time()))
                pending.pop(0)
            else:
                self._stop.wait(0.005)
