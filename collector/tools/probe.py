"""``rankscope probe RUN``: ask the collector a run streams to to time the links between its hosts
(its ``Probe`` RPC, collector.server.probe), and print each path's rate and which host's link is slow.

Exit code: 0 measured (whatever it found), 1 nothing could be measured, 2 bad arguments or the
collector refused.
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc

from collector.data import security
from collector.data.findings.probes import COLLECTOR, rates
from collector.data.queries.runs import AmbiguousRun
from collector.data.sql_guard import parse_byte_size
from collector.tools.profile import _resolve
from proto import pb, pb_grpc

# the collector answers when the probe is over: its bound is the pairs' (collector.server.probe)
RPC_TIMEOUT_S = 900.0


def main(args: argparse.Namespace) -> int:
    try:
        nbytes = parse_byte_size(args.bytes)
        token = security.resolve_token(args.token)
        channel = security.open_channel(args.endpoint, tls_ca=security.resolve_tls_ca(args.tls_ca))
        run_id = _resolve(args.data_dir, args.run)
    except (ValueError, security.SecurityConfigError, AmbiguousRun) as exc:
        print(f"rankscope probe: {exc}", file=sys.stderr)
        return 2
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    print(f"rankscope probe: timing the links of run {run_id} ...", file=sys.stderr)
    try:
        with channel:
            reply = pb_grpc.CollectorStub(channel).Probe(
                pb.ProbeRequest(run_id=run_id, hosts=hosts, bytes=nbytes, timeout_s=args.timeout),
                metadata=security.auth_metadata(token),
                timeout=RPC_TIMEOUT_S,
            )
    except grpc.RpcError as exc:
        print(f"rankscope probe: the collector at {args.endpoint} refused: {exc.code().name}: {exc.details()}")
        return 2
    report = json.loads(reply.report_json)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0 if report["measured"] else 1


def render(report: dict) -> str:
    """The report as a person reads it: who stood for each host, each path's rate, the verdict."""
    lines = [f"probe {report['request_id']} of run {report['run_id']}: {report['seconds']:.1f} s, "
             f"{report['bytes'] / (1 << 20):g} MiB each way per pair"]  # fmt: skip
    stood = ", ".join(f"{h} (rank {r})" for h, r in sorted(report["hosts"].items()))
    lines.append(f"  hosts: {stood}" + (f"; and {COLLECTOR} ({report['collector']})" if report["collector"] else ""))
    paths = rates(report["measured"])
    width = max((len(a) + len(b) for a, b in paths), default=10) + 4
    for (a, b), mbit_s in sorted(paths.items()):
        lines.append(f"  {a + ' -> ' + b:<{width}} {mbit_s:10.1f} Mbit/s")
    for line in report["refused"]:
        lines.append(f"  not measured: {line}")
    lines.append(f"verdict: {report['sentence']}")
    return "\n".join(lines)
