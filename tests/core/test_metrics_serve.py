"""A process's metrics endpoint: a port that another program holds does not stop the process."""

from __future__ import annotations

import socket
import threading
import urllib.request

from coorm.shared import metrics


def _held_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_port_held_for_good_leaves_the_process_without_metrics(monkeypatch):
    monkeypatch.setattr(metrics, "BIND_WAIT", 0.3)
    with _held_port() as holder:
        assert metrics.serve(holder.getsockname()[1], "127.0.0.1") is None


def test_a_port_held_for_a_moment_is_served_once_free(monkeypatch):
    monkeypatch.setattr(metrics, "BIND_WAIT", 30.0)
    holder = _held_port()
    port = holder.getsockname()[1]
    trying = threading.Event()
    real = metrics.start_http_server

    def start(*a, **kw):  # the first attempt fails on the held port; the holder then lets it go
        try:
            return real(*a, **kw)
        finally:
            if not trying.is_set():
                trying.set()
                holder.close()

    monkeypatch.setattr(metrics, "start_http_server", start)
    assert metrics.serve(port, "127.0.0.1") == port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert b"coorm_" in r.read()
