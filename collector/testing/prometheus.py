"""A real Prometheus server (Debian's ``prometheus`` package) scraping given targets, for tests.

    with PrometheusProcess(["127.0.0.1:9464"], tmp_path) as prom:   # returns once /-/ready answers
        prom.query('rankscope_step_time_seconds{run="job"}')          # the API's result list

It scrapes every second into a TSDB under the given directory; its output goes to a file
there, and an error from a failed start carries its end. With ``bearer_token`` it sends
``Authorization: Bearer <token>`` with every scrape, as a collector with a token requires.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from collector.testing.ports import ChildServer, answers_ok
from collector.tools.launch import free_port

PROMETHEUS = "/usr/bin/prometheus"


def prometheus_installed() -> bool:
    return os.access(PROMETHEUS, os.X_OK) or shutil.which("prometheus") is not None


class PrometheusProcess(ChildServer):
    def __init__(
        self,
        targets: list[str],
        workdir,
        timeout_s: float = 60.0,
        scrape_interval: str = "1s",
        bearer_token: str | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        quoted = ", ".join(f"'{t}'" for t in targets)
        auth = ""
        if bearer_token is not None:
            token_file = self.workdir / "token"
            token_file.write_text(bearer_token)
            token_file.chmod(0o600)
            auth = f"    authorization:\n      type: Bearer\n      credentials_file: '{token_file}'\n"
        config.write_text(
            f"global:\n  scrape_interval: {scrape_interval}\n  evaluation_interval: {scrape_interval}\n"
            f"scrape_configs:\n  - job_name: rankscope\n{auth}    static_configs:\n      - targets: [{quoted}]\n"
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(self.workdir / "prometheus.log", "wb")  # closed in stop()
        binary = PROMETHEUS if os.access(PROMETHEUS, os.X_OK) else shutil.which("prometheus")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not become ready: {self.output()}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        return answers_ok(f"{self.url}/-/ready")

    def query(self, expr: str) -> list[dict]:
        """The instant query's result list (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.load(reply)
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus query {expr!r} failed: {body}")
        return body["data"]["result"]

    def output(self, chars: int = 2000) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_bytes().decode(errors="replace")[-chars:] if path.exists() else ""
