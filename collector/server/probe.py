"""Time the links between the hosts of a live run: ``rankscope probe RUN`` (the ``Probe`` RPC).

When the run's own traffic cannot say which host's link is slow (two hosts whose every group spans
both, telemetry that arrived evenly: the slow-link finding's "or"), the collector asks. One rank on
each probed host (its lowest) opens a listener (collector.rank.probe), and the collector opens one
too, as a third end that is no training host's. Then, one pair at a time so that no two exchanges
share a link, the first rank of each pair sends ``bytes`` to the other and takes ``bytes`` back,
each cut at ``timeout_s`` (collector.data.probe_wire). The answers are rows of the run's ``probes``
table, so the slow-link finding reads them too (collector.data.findings.links); the reply carries
what was measured and the verdict (collector.data.findings.probes).

Which hosts: those asked for; else the candidates of the run's live slow-link finding and up to
REFERENCES others; else every host, when there are at most MAX_HOSTS. A collector on one of the
probed hosts is no third end (its paths are that host's), so it is left out.

What it costs: with H hosts, H(H-1)/2 + H pairs, each at most 2 x ``bytes`` on the two links it
crosses, one pair at a time; every transfer is cut at ``timeout_s``. The ranks do it on a thread of
their own (never the training thread); the bytes share the link with the job's traffic for as long
as they take. One probe at a time per collector.
"""

from __future__ import annotations

import dataclasses
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field

from collector.data import probe_wire
from collector.data.findings import probes as verdicts
from collector.data.findings.links import hosts_in_doubt
from collector.server.commands import new_request_id
from proto import pb

DEFAULT_BYTES = 4 << 20
DEFAULT_TIMEOUT_S = 3.0
MAX_TIMEOUT_S = 30.0
MAX_HOSTS = 8
REFERENCES = 2
LISTEN_WAIT_S = 10.0
PAIR_SLACK_S = 5.0  # a pair's answers may take this long beyond its transfers (the next step boundary, a flush)
FINAL = ("measured", "failed")
REASON = "rankscope probe"
WILDCARDS = ("", "0.0.0.0", "::", "[::]")


@dataclass
class Report:
    request_id: str
    run_id: str
    hosts: dict[str, int]  # probed host -> the rank that stood for it
    collector: str | None  # the collector's host, when it was an end
    measured: list[dict] = field(default_factory=list)  # the ranks' measured rows
    refused: list[str] = field(default_factory=list)
    named: tuple[str, ...] = ()
    ways: dict[str, str] = field(default_factory=dict)
    sentence: str = ""
    seconds: float = 0.0
    bytes: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class Prober:
    def __init__(self, liveness, findings=None) -> None:
        self.liveness, self.findings = liveness, findings
        self.bind_host = "0.0.0.0"  # the collector's own listen address (CollectorServer sets it)
        self._cond = threading.Condition()
        self._answers: dict[str, list[dict]] = {}
        self._busy = threading.Lock()
        self.reports: list[Report] = []  # the last ones, for tests and benchmarks

    def observe(self, rows) -> None:
        """Rows a stream carried ((table, run_id, Arrow table) each): the probes rows of a probe
        waiting here wake it. Never raises."""
        try:
            for table, _run_id, arrow in rows:
                if table != "probes":
                    continue
                with self._cond:
                    for row in arrow.to_pylist():
                        if row.get("request_id") in self._answers:
                            self._answers[row["request_id"]].append(row)
                    self._cond.notify_all()
        except Exception:
            pass

    def run(self, run_id: str, hosts=(), nbytes: int = 0, timeout_s: float = 0.0, candidates=None) -> Report:
        """Probe ``run_id``'s links now: ``hosts``, else ``candidates`` (default: the hosts the run's
        live slow-link finding leaves) and REFERENCES others, else all; ValueError naming what is wrong."""
        nbytes = int(nbytes or DEFAULT_BYTES)
        timeout_s = float(timeout_s or DEFAULT_TIMEOUT_S)
        if not 0 < nbytes <= probe_wire.MAX_BYTES:
            raise ValueError(f"bytes {nbytes} is outside 1..{probe_wire.MAX_BYTES}")
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout {timeout_s:g} s is outside (0, {MAX_TIMEOUT_S:g}]")
        streams = self.liveness.streams_of(run_id)
        if not streams:
            raise ValueError(f"no rank of run {run_id!r} streams to this collector now")
        first_rank: dict[str, int] = {}
        for rank in sorted(streams):
            first_rank.setdefault(streams[rank][1] or f"rank-{rank}", rank)
        if candidates is None:
            candidates = self._candidates(run_id)
        chosen = self._choose(run_id, list(hosts), first_rank, list(candidates))
        if not self._busy.acquire(blocking=False):
            raise ValueError("a probe is already running on this collector")
        try:
            return self._probe(run_id, {h: first_rank[h] for h in chosen}, streams, nbytes, timeout_s)
        finally:
            self._busy.release()

    def _choose(self, run_id: str, asked: list[str], first_rank: dict[str, int], candidates: list[str]) -> list[str]:
        if asked:
            unknown = [h for h in asked if h not in first_rank]
            if unknown:
                raise ValueError(
                    f"host(s) {', '.join(unknown)} stream no rank of run {run_id!r} here (it has {_few(first_rank)})"
                )
            chosen = list(dict.fromkeys(asked))
        else:
            if candidates:
                chosen = [h for h in candidates if h in first_rank]
                chosen += [h for h in sorted(first_rank) if h not in chosen][:REFERENCES]
            else:
                chosen = sorted(first_rank)
        if len(chosen) < 2:
            raise ValueError(
                f"run {run_id!r} streams from one host here ({_few(first_rank)}): no link between hosts to time"
            )
        if len(chosen) > MAX_HOSTS:
            raise ValueError(f"{len(chosen)} hosts to probe; at most {MAX_HOSTS}: name them with --hosts")
        return chosen

    def _candidates(self, run_id: str) -> list[str]:
        """The hosts the run's live slow-link finding leaves (its "or"), most recent finding first."""
        if self.findings is None:
            return []
        try:
            _, held, found, _ = self.findings.answer(run_id)
        except Exception:
            return []
        links = [f for f in (found or []) if f.kind == "slow_link"] if held else []
        if not links:
            return []
        return hosts_in_doubt(max(links, key=lambda f: f.steps[0]))

    def _probe(self, run_id, ranks: dict[str, int], streams, nbytes: int, timeout_s: float) -> Report:
        started = time.monotonic()
        request_id, token = new_request_id("probe"), secrets.token_hex(probe_wire.TOKEN_CHARS // 2)
        own_host = socket.gethostname()
        with_collector = own_host not in ranks
        report = Report(request_id, run_id, dict(ranks), own_host if with_collector else None, bytes=nbytes)
        n_pairs = len(ranks) * (len(ranks) - 1) // 2 + (len(ranks) if with_collector else 0)
        pair_bound = 2 * timeout_s + PAIR_SLACK_S
        window = LISTEN_WAIT_S + n_pairs * pair_bound
        with self._cond:
            self._answers[request_id] = []
        listener = None
        try:
            if with_collector:
                listener = probe_wire.Listener(token, max_bytes=nbytes, window_s=window, host=self._listen_host())
            ask = pb.RankRequest(kind="probe_listen", id=request_id, token=token, timeout_s=window, reason=REASON)
            for rank in ranks.values():
                streams[rank][0].request(ask)
            heard = self._wait(request_id, lambda rows: {r["rank"] for r in rows} >= set(ranks.values()), LISTEN_WAIT_S)
            address = {}
            for host, rank in ranks.items():
                row = next((r for r in heard if r["rank"] == rank), None)
                ip = getattr(streams[rank][0], "peer", "")
                if row is None or row["status"] != "listening":
                    report.refused.append(f"{host} (rank {rank}): {row['detail'] if row else 'no answer'}")
                elif not _is_ip(ip):
                    report.refused.append(f"{host} (rank {rank}): its stream's address {ip!r} is not an IP")
                else:
                    address[host] = _join(ip, int(row["port"]))
            ends = sorted(address)
            pairs = [(a, b) for i, a in enumerate(ends) for b in ends[i + 1 :]]
            peer_of = {h: pb.ProbePeer(rank=ranks[h], host=h, address=address[h]) for h in ends}
            if listener is not None and ends:
                mine = _join(self._advertised_ip(getattr(streams[ranks[ends[0]]][0], "peer", "")), listener.port)
                peer_of[verdicts.COLLECTOR] = pb.ProbePeer(rank=-1, host=own_host, address=mine)
                pairs += [(h, verdicts.COLLECTOR) for h in ends]
            for a, b in pairs:
                peer = peer_of[b]
                ask = pb.RankRequest(kind="probe", id=request_id, token=token, bytes=nbytes, timeout_s=timeout_s)
                ask.peers.append(peer)
                ask.reason = REASON
                streams[ranks[a]][0].request(ask)
                done = self._wait(request_id, _pair_done(ranks[a], peer.rank), pair_bound)
                if not _pair_done(ranks[a], peer.rank)(done):
                    report.refused.append(f"{a} (rank {ranks[a]}) -> {b}: no answer within {pair_bound:g} s")
        finally:
            if listener is not None:
                listener.close()
            with self._cond:
                rows = self._answers.pop(request_id, [])
        report.measured = [r for r in rows if r["status"] == "measured"]
        failed = [r for r in rows if r["status"] == "failed"]
        report.refused += [f"rank {r['rank']} -> {r['peer_host']} ({r['direction']}): {r['detail']}" for r in failed]
        verdict = verdicts.judge(verdicts.rates(report.measured))
        report.named, report.ways, report.sentence = verdict.hosts, verdict.ways, verdict.sentence
        report.seconds = time.monotonic() - started
        self.reports = [*self.reports[-9:], report]
        return report

    def _wait(self, request_id: str, enough, timeout_s: float) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not enough(self._answers[request_id]) and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return list(self._answers[request_id])

    def _listen_host(self) -> str:
        return "0.0.0.0" if self.bind_host in WILDCARDS else self.bind_host.strip("[]")

    def _advertised_ip(self, toward: str) -> str:
        """The collector's address the ranks reach it by: its bind address, else the interface toward a rank."""
        if self.bind_host not in WILDCARDS:
            return self.bind_host.strip("[]")
        family = socket.AF_INET6 if ":" in toward else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((toward, 9))  # no packet: a route lookup
            return s.getsockname()[0]


def _pair_done(rank: int, peer_rank: int):
    def done(rows) -> bool:
        mine = [r for r in rows if (r["rank"], r["peer_rank"]) == (rank, peer_rank) and r["status"] in FINAL]
        return any(r["status"] == "failed" for r in mine) or len(mine) >= 2

    return done


def _is_ip(text: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, text)
            return True
        except OSError:
            pass
    return False


def _join(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _few(first_rank: dict[str, int]) -> str:
    names = sorted(first_rank)
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
