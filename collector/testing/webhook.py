"""``WebhookReceiver``: a local HTTP endpoint for the collector's alert webhook
(collector.server.alerts) to post to; it keeps each post's JSON body and when it arrived.

    with WebhookReceiver() as hook:
        ... rankscope collect --alert-webhook {hook.url} ...
        hook.bodies[0]["finding"]["kind"], hook.arrivals[0]
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class WebhookReceiver:
    def __init__(self) -> None:
        self.bodies: list[dict] = []  # each post's JSON, in arrival order
        self.arrivals: list[float] = []  # when each arrived (unix s), beside bodies
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                arrived = time.time()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.arrivals.append(arrived)
                receiver.bodies.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):  # keep test and bench output clean
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
