"""Prometheus metrics of a rank's loader (docs/operations.md, "Metrics").

The coordinator and the DataServers serve their own (``--metrics-listen HOST:PORT``); a rank's
numbers live in its process, in ``DataLoader.stats()``. This module renders them in
Prometheus' text exposition format (0.0.4) and, optionally, serves them::

    import datahelix.metrics
    text = datahelix.metrics.render(loader.stats(), labels={"rank": "0"})
    server = datahelix.metrics.serve_metrics(loader, port=9465)   # GET /metrics
    ...
    server.close()

Every number is the client's own counter (``dh_client_stats``), renamed with its unit:
``wait_s`` is ``datahelix_client_wait_seconds_total``, ``bytes_delivered`` is
``datahelix_client_delivered_bytes_total``, and so on (``METRICS`` lists them). A key that
``stats()`` gains later and this table does not know is rendered as a gauge named after it,
so nothing is silently dropped.
"""
from __future__ import annotations

import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

__all__ = ["METRICS", "CONTENT_TYPE", "render", "serve_metrics", "MetricsServer"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: stats() key -> (metric name, type, help)
METRICS: Dict[str, Tuple[str, str, str]] = {
    "batches": ("datahelix_client_batches_total", "counter", "Batches next() returned."),
    "samples": ("datahelix_client_samples_total", "counter", "Samples in those batches."),
    "samples_failed": ("datahelix_client_samples_failed_total", "counter",
                       "Samples that came flagged failed (on_error=skip)."),
    "requests_sent": ("datahelix_client_requests_sent_total", "counter",
                      "REQUESTs sent to the coordinator."),
    "deliveries": ("datahelix_client_deliveries_total", "counter", "DELIVERs filed."),
    "duplicates_dropped": ("datahelix_client_duplicates_dropped_total", "counter",
                           "DELIVERs dropped as duplicates (a request executed twice after a "
                           "fault)."),
    "bytes_delivered": ("datahelix_client_delivered_bytes_total", "counter",
                        "Tensor bytes of delivered batches."),
    "copied_tensors": ("datahelix_client_copied_tensors_total", "counter",
                       "Tensors that came by copy, not in the arena (a full arena)."),
    "copy_bytes": ("datahelix_client_copy_bytes_total", "counter",
                   "Bytes the fanout join copied."),
    "notices": ("datahelix_client_notices_total", "counter",
                "Deliveries that came on the local notice channel."),
    "wait_s": ("datahelix_client_wait_seconds_total", "counter",
               "Seconds next() blocked waiting for a batch (the training loop's stall)."),
    "s_per_token": ("datahelix_client_compute_seconds_per_token", "gauge",
                    "Learned compute seconds per token of the training step (0 before data)."),
    "steps_total": ("datahelix_client_planned_steps", "gauge",
                    "Batches this client will deliver in the pass."),
    "prefetch_now": ("datahelix_client_prefetch_batches", "gauge",
                     "The prefetch horizon now, in batches."),
    "rebalance_rounds": ("datahelix_client_rebalance_rounds_total", "counter",
                         "Tier-2 rounds this rank took part in."),
    "rebalance_applied": ("datahelix_client_rebalance_applied_total", "counter",
                          "Tier-2 rounds that moved parts."),
    "rebalance_kept_by_gate": ("datahelix_client_rebalance_kept_by_gate_total", "counter",
                               "Tier-2 rounds the cost gate kept as they were."),
    "rebalance_moved_parts": ("datahelix_client_rebalance_moved_parts_total", "counter",
                              "Parts this rank received by tier 2."),
    "rebalance_moved_samples": ("datahelix_client_rebalance_moved_samples_total", "counter",
                                "Samples this rank received by tier 2."),
    "rebalance_bytes": ("datahelix_client_rebalance_bytes_total", "counter",
                        "Bytes of the parts received by tier 2."),
    "rebalance_bytes_remote": ("datahelix_client_rebalance_remote_bytes_total", "counter",
                               "Of those, bytes forwarded from other nodes."),
    "rebalance_exchanges": ("datahelix_client_rebalance_exchanges_total", "counter",
                            "Tier-2 rounds whose bytes came through exchange_fn."),
    "rebalance_transfer_s_total": ("datahelix_client_rebalance_transfer_seconds_total",
                                   "counter", "Seconds those exchanges took."),
    "rebalance_callback_errors": ("datahelix_client_rebalance_callback_errors_total", "counter",
                                  "feature_fn / sort_fn calls that raised or answered badly."),
    "rebalance_s_p95": ("datahelix_client_rebalance_decision_p95_seconds", "gauge",
                        "p95 of a round's last part materialized to its decision applied."),
    "rebalance_s_max": ("datahelix_client_rebalance_decision_max_seconds", "gauge",
                        "The most of the same."),
    "rebalance_final_s_p95": ("datahelix_client_rebalance_final_p95_seconds", "gauge",
                              "p95 of a round's last part materialized to its batches final."),
    "rebalance_transfer_s_p95": ("datahelix_client_rebalance_transfer_p95_seconds", "gauge",
                                 "p95 of the exchanges' transfer time."),
}

StatsSource = Union[Callable[[], Mapping[str, Any]], Any]


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(float(v))


def _generic_name(key: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in key)
    return "datahelix_client_" + safe


def render(stats: Mapping[str, Any], labels: Optional[Mapping[str, str]] = None) -> str:
    """``stats`` (a ``DataLoader.stats()`` dict) in the text exposition format 0.0.4: a HELP
    and a TYPE line and one sample per number, each with ``labels`` (e.g. ``{"rank": "0"}``).
    Non-numeric values are skipped; booleans count as 0 or 1."""
    label_text = ""
    if labels:
        label_text = "{" + ",".join(f'{k}="{_escape_label(str(v))}"'
                                    for k, v in sorted(labels.items())) + "}"
    lines = []
    for key, value in stats.items():
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float)):
            continue
        name, kind, help_text = METRICS.get(
            key, (_generic_name(key), "gauge", f"DataLoader.stats()['{key}']."))
        lines.append(f"# HELP {name} {_escape_help(help_text)}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{label_text} {_value(float(value))}")
    return "\n".join(lines) + ("\n" if lines else "")


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
