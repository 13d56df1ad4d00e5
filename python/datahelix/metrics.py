"""Prometheus metrics of a rank's loader (docs/operations.md, "Metrics").

The coordinator and the DataServers serve their own (``--metrics-listen HOST:PORT``); a rank's
numbers live in its process, in ``DataLoader.stats()``. This module renders them in
Prometheus' text exposition format (0.0.4) and, optionally, serves them::

    import datahelix.metrics
    text = datahelix.metrics.render(loader.stats(), labels={"rank": "0"})
    server = datahelix.metrics.serve_metrics(loader, port=9465)   # GET /metrics
    ...
    server.close()

Every number is the client's own (``dh_client_stats``), named with its unit in the client's
table of stats and metrics, which lives in C (src/runtime/stats_table.h) with the
coordinator's and the DataServer's: ``wait_s`` is ``datahelix_client_wait_seconds_total``,
``bytes_delivered`` is ``datahelix_client_delivered_bytes_total``, and so on (``METRICS``, built
from that table at import, lists them). The text is rendered by the daemons' own Prometheus
writer (``_C.Client.render_metrics``). A key that ``stats()`` gains and the table does not know
is rendered as a gauge named after it (``datahelix_client_<key>``, characters outside
``[A-Za-z0-9_]`` as ``_``), so nothing is silently dropped.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from . import _C

__all__ = ["METRICS", "CONTENT_TYPE", "render", "serve_metrics", "MetricsServer"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: stats() key -> (metric name, type, help), from the client's table in C
METRICS: Dict[str, Tuple[str, str, str]] = {
    key: (metric, kind, help_text)
    for key, _, metric, kind, _, help_text in _C.Client.metrics_table() if metric}

StatsSource = Union[Callable[[], Mapping[str, Any]], Any]


def render(stats: Mapping[str, Any], labels: Optional[Mapping[str, str]] = None) -> str:
    """``stats`` (a ``DataLoader.stats()`` dict) in the text exposition format 0.0.4: a HELP
    and a TYPE line and one sample per number, each with ``labels`` (e.g. ``{"rank": "0"}``).
    Non-numeric values are skipped; booleans count as 0 or 1."""
    return _C.Client.render_metrics(stats, labels)


def _stats_of(source: StatsSource) -> Mapping[str, Any]:
    if hasattr(source, "stats"):
        return source.stats()
    return source()


class MetricsServer:
    """An HTTP server answering ``GET /metrics`` from a daemon thread (``serve_metrics``).
    ``port`` is the port bound; ``close()`` stops it (also on ``with``)."""

    def __init__(self, source: StatsSource, host: str, port: int,
                 labels: Optional[Mapping[str, str]]):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "the metrics are at /metrics")
                    return
                try:
                    body = render(_stats_of(owner._source), owner._labels).encode()
                except Exception as e:  # a closed loader: say so, do not kill the thread
                    self.send_error(500, f"stats() failed: {e}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # quiet: scrapes every few seconds
                pass

        self._source = source
        self._labels = dict(labels) if labels else None
        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="datahelix-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()
            self._httpd = None

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_metrics(source: StatsSource, port: int = 0, host: str = "127.0.0.1",
                  labels: Optional[Mapping[str, str]] = None) -> MetricsServer:
    """Serves ``render(source.stats())`` (a DataLoader, or any callable returning a stats
    dict) at ``http://host:port/metrics`` from a daemon thread; port 0 picks a free one
    (``.port``). Each scrape calls ``stats()``, which takes the client's lock briefly.
    Returns the server; ``close()`` it when done."""
    return MetricsServer(source, host, port, labels)
