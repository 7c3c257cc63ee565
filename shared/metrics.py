"""Every Prometheus metric CooRM exports, defined once (as subjects and keys are). Each process exports the
ones its service updates, on its own port (``COORM_METRICS_PORT``); the dashboards in ``dashboards/``
query only these names, and a test checks that against a live ``coorm up``.

Label values are the papers' words: request types ``pre-allocation`` / ``non-preemptible`` /
``preemptible``, end reasons of :class:`coorm.shared.events.EndReason`, application kinds as the launcher gives
them in its session (``rigid``, ``moldable``, ``psa``, ``amr``...)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

# --- the policy engine: what the cluster is doing (refreshed from the cores' status every second) -------
CLUSTER_NODE_STATES = ("up", "non_preemptible", "pre_allocated_unused", "preemptible", "fair_start_held", "idle")
cluster_nodes = Gauge("coorm_cluster_nodes", "Nodes of a cluster by what they do now (a partition of the up "
                      "nodes, plus 'up' itself)", ["cluster", "state"])
requests_waiting = Gauge("coorm_requests_waiting", "Requests submitted and not started", ["cluster", "type"])
requests_running = Gauge("coorm_requests_running", "Requests started and not ended", ["cluster", "type"])
ESTIMATE_STATS = ("soonest", "median", "latest")
waiting_estimated_start = Gauge(
    "coorm_waiting_estimated_start_seconds",
    "Seconds from now to the estimated start of the waiting requests (the views' estimate; requests that "
    "cannot be placed at all are left out)", ["cluster", "stat"])
sessions = Gauge("coorm_sessions", "Open sessions by application kind", ["kind"])
app_nodes = Gauge("coorm_app_nodes", "Nodes held by started requests, by application kind and request type",
                  ["kind", "type"])
leader = Gauge("coorm_policy_leader", "1 while this policy engine holds the lease, 0 on standby")
heartbeat_interval = Gauge("coorm_session_heartbeat_interval_seconds", "Seconds between a paced session's "
                           "heartbeats, as the leading engine tells them (longer past COORM_HEARTBEAT_RATE)")

policy_pass_seconds = Histogram(
    "coorm_policy_pass_seconds", "Wall time of one policy pass (schedule, starts, kills, views)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
request_start_latency_seconds = Histogram(
    "coorm_request_start_latency_seconds", "From a request's acceptance to its start decision", ["type"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600))
messages_received = Counter("coorm_messages_received_total", "Protocol messages a service handled",
                            ["subject"])  # the verb: session.open, request, done, close, heartbeat, ...
error_replies = Counter("coorm_error_replies_total", "Messages refused with an error reply", ["code"])
dead_letters = Counter("coorm_dead_letters_total", "Stream messages set aside (dead-lettered) by their consumer: "
                       "not valid, or failing every delivery", ["stream"])
kills = Counter("coorm_kills_total", "Ends of started requests decided by the RMS, by reason", ["reason"])
KILL_REASONS = ("walltime", "violation", "node_failure", "session_closed", "container_ended")
preemptions = Counter("coorm_preemptions_total", "Preemptible nodes the RMS asked launchers to give back",
                      ["cluster"])
allocation_changes = Counter(
    "coorm_allocation_changes_total", "Nodes gained (grow) or given back (shrink) by applications, by kind",
    ["kind", "direction"])

# --- view publisher and node allocator: what goes out to launchers ----------------------------------------
notifications = Counter("coorm_notifications_total", "Notifications sent to launchers", ["kind"])
notification_bytes = Counter("coorm_notification_bytes_total", "Bytes of notifications sent to launchers",
                             ["kind"])

# --- node allocator: the agents as the RMS sees them ------------------------------------------------------
agent_nodes = Gauge("coorm_agent_nodes", "Registered nodes by liveness", ["cluster", "state"])
agent_heartbeat_age = Gauge("coorm_agent_heartbeat_age_seconds", "Seconds since an agent's last heartbeat",
                            ["agent", "cluster"])

# --- node agents ------------------------------------------------------------------------------------------
agent_heartbeats = Counter("coorm_agent_heartbeats_total", "Heartbeats this agent sent", ["agent", "cluster"])
agent_processes = Gauge("coorm_agent_processes", "Application processes running under this agent",
                        ["agent", "cluster"])
agent_process_exits = Counter("coorm_agent_process_exits_total", "Application processes ended, by outcome",
                              ["agent", "cluster", "outcome"])  # ok, failed, killed

# --- accounting -------------------------------------------------------------------------------------------
lifecycle_events = Counter("coorm_lifecycle_events_total", "Allocation lifecycle events recorded", ["kind"])
usage_node_seconds = Counter("coorm_usage_node_seconds_total", "Node-seconds used, by user and request type",
                             ["user", "type"])
usage_requests = Counter("coorm_usage_requests_total", "Requests started, by user and request type",
                         ["user", "type"])
usage_wait_seconds = Counter("coorm_usage_wait_seconds_total", "Seconds requests waited to start, by user",
                             ["user"])
usage_preemptions = Counter("coorm_usage_preemptions_total", "Ends by the RMS (preemption, violation, "
                            "walltime...) suffered, by user", ["user"])


def defined() -> list[MetricWrapperBase]:
    """Every metric of this module (what the dashboards may query, and what a live system must export)."""
    return [obj for obj in globals().values() if isinstance(obj, MetricWrapperBase)]


BIND_WAIT = 3.0  # seconds a port in use is tried again: another program's probe for a free port holds it briefly


def serve(port: int | None, addr: str = "0.0.0.0") -> int | None:
    """Expose this process's metrics on ``port`` (0: a free one; None: not at all). Returns the port, or None
    if it stays in use: the process goes on without serving its metrics (its scrape target is down, and
    its log says why) -- a port taken by another program is no reason for a service or an agent to stop.
    (``coorm up`` picks each process's port before starting it, and several systems starting side by side
    on one host can pick the same one.)"""
    if port is None:
        return None
    import errno
    import time

    import structlog

    from coorm.shared.events import ErrorCode

    zero(error_replies, *((c.value,) for c in ErrorCode))
    deadline = time.monotonic() + BIND_WAIT
    while True:
        try:
            server, _thread = start_http_server(port, addr=addr)
            return server.server_address[1]
        except OSError as e:
            if e.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                structlog.get_logger("coorm.metrics").error("metrics not served: the port cannot be bound", port=port,
                                                            addr=addr, error=str(e))
                return None
        time.sleep(0.1)  # (before the process's event loop: nothing else to do meanwhile)


def zero(counter_or_gauge, *label_sets: tuple[str, ...]) -> None:
    """Create labelled children up front, so that a rate over a quiet series is 0 rather than no data."""
    for labels in label_sets:
        with contextlib.suppress(ValueError):
            counter_or_gauge.labels(*labels)
