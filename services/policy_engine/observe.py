"""The policy engine's Prometheus metrics: counters fed from the decisions as they are published, gauges
refreshed from the cores' counts (a read, like ``coorm status``) once a second. Outside the cores: they
never see a metric."""

from __future__ import annotations

import statistics

from coorm.launchers.kinds import NAMES as SHIPPED_KINDS
from coorm.services.policy_engine.status import Counts
from coorm.shared import metrics as m
from coorm.shared.events import EndRequest, PreemptionDeadline, StartRequest
from coorm.shared.requests import RequestType

_TYPES = tuple(t.value for t in RequestType)


def init() -> None:
    """Every series a dashboard shows exists from the start (a quiet counter reads 0, not 'no data')."""
    m.zero(m.kills, *((r,) for r in m.KILL_REASONS))
    m.zero(m.request_start_latency_seconds, *((t,) for t in _TYPES))
    m.zero(m.allocation_changes, *((k, d) for k in SHIPPED_KINDS for d in ("grow", "shrink")))
    m.leader.set(0)


def decisions(decisions: list, kind_of_app, submitted_at) -> None:
    """Count what the RMS decided: starts (and how long they waited), ends by the RMS, preemptions, and
    every application's grow/shrink."""
    for d in decisions:
        if isinstance(d, StartRequest):
            sub = submitted_at(d.request)
            if sub is not None:
                m.request_start_latency_seconds.labels(d.type.value).observe(max(0.0, d.at - sub))
            if d.type is not RequestType.PRE_ALLOCATION:
                m.allocation_changes.labels(kind_of_app(d.app), "grow").inc(d.nodes)
        elif isinstance(d, EndRequest):
            if d.reason.value in m.KILL_REASONS and d.started:
                m.kills.labels(d.reason.value).inc()
            if d.started and d.type is not RequestType.PRE_ALLOCATION:
                m.allocation_changes.labels(kind_of_app(d.app), "shrink").inc(d.nodes)
        elif isinstance(d, PreemptionDeadline):
            m.preemptions.labels(d.cluster).inc(max(0, d.held - d.allowed))


def clear() -> None:
    """No state gauges: a standby (or a leader that lost its lease) must not be summed with the leader."""
    for g in (m.cluster_nodes, m.requests_waiting, m.requests_running, m.waiting_estimated_start, m.sessions,
              m.app_nodes):
        g.clear()


def gauges(counts: Counts) -> None:
    """Set the gauges from the cores' counts (clearing series of clusters, kinds or types that went away)."""
    clear()
    for c in counts.clusters:
        for state, value in (("up", c.up), ("non_preemptible", c.non_preemptible),
                             ("pre_allocated_unused", c.pre_allocated_unused), ("preemptible", c.preemptible),
                             ("fair_start_held", c.held), ("idle", c.idle)):
            m.cluster_nodes.labels(c.cluster, state).set(value)
        m.zero(m.preemptions, (c.cluster,))
        for t in _TYPES:
            m.requests_waiting.labels(c.cluster, t).set(0)
            m.requests_running.labels(c.cluster, t).set(0)
    for kind, n in counts.sessions.items():
        m.sessions.labels(kind).set(n)
    for (cluster, t), n in counts.running.items():
        m.requests_running.labels(cluster, t).set(n)
    for (kind, t), n in counts.app_nodes.items():
        m.app_nodes.labels(kind, t).set(n)
    for (cluster, t), n in counts.waiting.items():
        m.requests_waiting.labels(cluster, t).set(n)
    for cluster, ws in counts.waits.items():
        m.waiting_estimated_start.labels(cluster, "soonest").set(min(ws))
        m.waiting_estimated_start.labels(cluster, "median").set(statistics.median(ws))
        m.waiting_estimated_start.labels(cluster, "latest").set(max(ws))
