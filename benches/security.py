"""Sustained ingest with and without auth + TLS, side by side in one run.

A collector process per configuration (plaintext; bearer token; token + TLS with
a throwaway CA made by the openssl CLI). A sender process streams pre-encoded
comm envelopes of ``--rows`` rows on ``--streams`` streams and waits for every
ack (durable). Configurations are interleaved over ``--repeats`` rounds so that
a busy machine disturbs them alike; the median round is reported.

    .venv/bin/python -m benches.security [--envelopes 200] [--rows 4096] [--streams 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from collector.testing.fake_runs import comm_columns
from collector.testing.pki import make_pki
from collector.tools.launch import CollectorProcess


def _send(port: int, token: str | None, ca: Path | None, envelopes: int, rows: int, streams: int) -> float:
    """Rows per second from first send to last ack, over ``streams`` concurrent streams."""
    from collector.data import security
    from collector.data.codec import encode_batch
    from proto import SCHEMA_VERSION, pb, pb_grpc

    batch = encode_batch("comm", "bench", 0, comm_columns(0, 0, rows))
    channel = security.open_channel(f"127.0.0.1:{port}", tls_ca=ca)
    stub = pb_grpc.CollectorStub(channel)
    stub.Health(pb.HealthRequest(), metadata=security.auth_metadata(token), timeout=30)  # handshake outside the clock
    per_stream = envelopes // streams
    client_tag = f"{time.monotonic_ns()}"

    def one(k: int):
        envs = [
            pb.Envelope(schema_version=SCHEMA_VERSION, client_id=f"b{client_tag}-{k}", seq=s + 1, table=batch)
            for s in range(per_stream)
        ]
        acked = 0
        for ack in stub.Stream(iter(envs), metadata=security.auth_metadata(token)):
            acked += len(ack.seqs)
        assert acked == per_stream, acked

    threads = [threading.Thread(target=one, args=(k,)) for k in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    channel.close()
    return per_stream * streams * rows / elapsed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envelopes", type=int, default=200)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(Path(__file__).with_name("RESULTS-security.md")))
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="rankscope-bench-security-"))
    pki = make_pki(work)
    ca, cert, key = pki.ca, pki.cert, pki.key
    token = "bench-token-0123456789"
    configs = {
        "plaintext, no token": ("", "", ""),
        "plaintext + token": (token, "", ""),
        "TLS + token": (token, str(cert), str(key)),
    }
    results: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(args.repeats):
        for name, (tok, c, k) in configs.items():
            data = work / f"data-{r}-{len(results[name])}-{name[:3]}"
            options = (["--token", tok] if tok else []) + (["--tls-cert", c, "--tls-key", k] if c else [])
            with CollectorProcess(data, *options) as collector:
                results[name].append(
                    _send(collector.port, tok or None, ca if c else None, args.envelopes, args.rows, args.streams)
                )
            print(f"round {r + 1} {name}: {results[name][-1] / 1e6:.3f} M rows/s", flush=True)

    base = statistics.median(results["plaintext, no token"])
    load = os.getloadavg()
    lines = [
        "# Ingest with auth and TLS on vs off",
        "",
        f"Command: `.venv/bin/python -m benches.security --envelopes {args.envelopes} --rows {args.rows} "
        f"--streams {args.streams} --repeats {args.repeats}`",
        f"Machine: {platform.machine()} VM, {os.cpu_count()} CPU cores, shared with other jobs "
        f"(load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end); Python {platform.python_version()}.",
        "",
        f"{args.envelopes} comm envelopes of {args.rows} rows ({args.envelopes * args.rows:,} rows) over "
        f"{args.streams} streams into a collector process on 127.0.0.1, timed from first send to last ack "
        "(durable). Configurations interleaved, one fresh collector each; median of the rounds.",
        "",
        "| configuration | median M rows/s | vs plaintext | rounds (M rows/s) |",
        "|---|---:|---:|---|",
    ]
    for name, vals in results.items():
        med = statistics.median(vals)
        lines.append(f"| {name} | {med / 1e6:.3f} | {med / base:.2f}x | {', '.join(f'{v / 1e6:.3f}' for v in vals)} |")
    spread = {name: (min(v) / 1e6, max(v) / 1e6) for name, v in results.items()}
    lines += [
        "",
        "Reading it: the token check is one constant-time compare per RPC (once per stream, "
        "not per message); TLS encrypts every byte (in gRPC's C core, outside the GIL). Where a "
        "configuration's rounds overlap the baseline's range "
        f"({spread['plaintext, no token'][0]:.3f}-{spread['plaintext, no token'][1]:.3f}), the "
        "difference is within this machine's noise, not a cost of the setting.",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
