"""The twin's simulated half: the same scenario through the simulator (the same cores and launcher objects
in virtual time), with or without the live system's delays (:class:`~coorm.simulator.delays.Delays`), and
the delays calibrated from what the live half measured."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

from coorm.experiments.twin_workload import Pin, TwinApp, launcher, props
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared.requests import RequestType
from coorm.simulator.delays import Delays
from coorm.simulator.engine import Result, Simulation


@dataclass
class SimRun:
    result: Result
    requests: list[dict]  # name, request, type, cluster, nodes, start, end (RMS-side, as the live lifecycle)
    cpu: float  # the whole simulation's CPU seconds (cores, launchers, the engine)


def policy(live_settings: dict) -> PolicySettings:
    """The policy core's settings of the live run (the policy engine derives them the same way)."""
    return PolicySettings(fair_start=live_settings["fair_start"],
                          reschedule_interval=live_settings["reschedule_interval"],
                          preempt_grace=live_settings["preempt_grace"], pass_burst=live_settings["pass_burst"],
                          oversize_waits=live_settings["oversize_waits"],
                          preemptible=live_settings["malleable_policy"])


# how a rigid job's exit (its launch and exit together, ``work_overhead``) is modelled: one constant (their
# mean, as before); a line in its nodes; or a plane in its nodes and the nodes other launches began on in
# the 0.1 s before it (``work_overhead_launching``): the agents share the machine, so a launch among others
# is answered later -- on the stored twin run, its nodes alone explain 9 % of the overheads' variance, with
# the launches around it 50 % (EXPERIMENTS.md)
EXIT_MODELS = ("constant", "nodes", "launching")


def centre(values: list[float], quantile: float | None = None) -> float:
    """The value a calibrated delay takes from its samples: their mean, or their ``quantile`` (interpolated
    between the two nearest: 0.5 is their median)."""
    if quantile is None:
        return statistics.fmean(values)
    v = sorted(values)
    at = quantile * (len(v) - 1)
    low = min(int(at), len(v) - 1)
    high = min(low + 1, len(v) - 1)
    return v[low] + (v[high] - v[low]) * (at - low)


# how the twin's simulators model the views (twin.compare stores them with a run; a run stored without them was
# simulated the earlier way, each default below off): its launchers follow the views their sessions ask for on
# opening (Delays.opening_views), and the views' latency is this quantile of its samples (None: their mean)
OPENING_VIEWS = True
VIEWS_QUANTILE = 0.5


def views_source(samples: dict[str, list[float]]) -> str:
    """The samples the views' latency is calibrated and drawn on: the rounds no pacing held when the run
    measured them (``views_unheld``), else every round (a run stored before)."""
    return "views_unheld" if samples.get("views_unheld") else "views"


def calibrate(samples: dict[str, list[float]], live_settings: dict, views_apart: bool = False,
              exit_model: str = "constant", quantile: float | None = None, opening_views: bool = OPENING_VIEWS,
              views_quantile: float | None = VIEWS_QUANTILE) -> Delays:
    """The delays the live run measured, and its view pacing (its own settings); ``views_apart``: the views
    heard with their own measured latency (the mean of ``views``), not behind a start (``Delays.view_notify``).
    Each delay is the mean of its samples: the delays add up over a run (a start waits for the end before
    it, which waited...), so the tails count -- the median, the typical event, made the simulated run early
    on average (on an earlier stored run: a mean wait 0.4 s shorter than live's, p95 |start| before the fork
    0.21 s against 0.14 s with the means). A launch's time is a line in its nodes (Theil-Sen: the tails would tilt a
    least-squares one), scaled to the samples' mean. A rigid job's exit is ``exit_model``
    (:data:`EXIT_MODELS`; one the run did not measure the inputs of falls back to the constant): a line in
    its nodes as a launch's is; a plane fitted by least squares (its mean the samples', no slope below 0).
    ``quantile``: each constant that quantile of its samples instead of their mean, and the launch's line scaled
    to it (``twin_resim --quantile``: how the model's branch depends on it). A run stored before the answers'
    time (``reply``) was measured has no samples of it: its launchers send their commands at once, as the
    simulator had them then (``twin_resim --reply`` gives it one).

    The views are the exception: their latency is ``views_quantile`` of its samples, the median by default (a
    quantile given applies to them too). A view's measured latency runs from the pass that computed it
    (``ChangeNotify.now``), so it holds the live pacing's wait for its round as well, which the simulator's
    own :class:`~coorm.services.policy_engine.view_pacing.ViewPacer` already makes: on a live twin run, a round
    that came less than 0.15 s after the one before was heard a median 94 ms after its pass, one that came
    later 6 ms (mean 13 ms), the views of a round within 0.1 ms of each other, whatever their place in it or
    the application's kind. Their mean (40 ms there) counts the pacing twice; their median (8 ms) is near the
    rounds not held -- on a quiet machine: on a loaded one most rounds are held, and the median of all of them
    counts the pacing too (44 ms against 12 ms). So a run that measured them (``views_unheld``, the rounds no
    pacing held) is calibrated on those; a run stored before, on all. ``opening_views``: its launcher follows
    the views its session asks for on opening (:class:`~coorm.simulator.delays.Delays`)."""
    views_at = quantile if quantile is not None else views_quantile
    views = samples.get(views_source(samples))
    mean = {k: centre(samples[k], quantile) if samples.get(k) else 0.0
            for k in ("notify", "command", "reply", "work_overhead", "open")}
    a, b = mean_line(samples.get("launch_nodes", []), samples.get("launch", []), quantile)
    if exit_model not in EXIT_MODELS:
        raise ValueError(f"no exit model {exit_model}; one of {EXIT_MODELS}")
    over, nodes = samples.get("work_overhead", []), samples.get("work_overhead_nodes", [])
    launching = samples.get("work_overhead_launching", [])
    e, f, g = mean["work_overhead"], 0.0, 0.0
    if exit_model == "launching" and over and len(nodes) == len(launching) == len(over):
        e, f, g = plane([[1.0, n, k] for n, k in zip(nodes, launching, strict=True)], over)
    elif exit_model != "constant" and over and len(nodes) == len(over):
        e, f = mean_line(nodes, over)
    return Delays(notify=max(0.0, mean["notify"]), command=max(0.0, mean["command"]), open=max(0.0, mean["open"]),
                  reply=max(0.0, mean["reply"]),
                  exit=max(0.0, e), exit_per_node=max(0.0, f), exit_per_launching=max(0.0, g),
                  launch=max(0.0, a), launch_per_node=max(0.0, b),
                  view_period=live_settings["view_period"], view_rate=live_settings["view_rate"], live_views=True,
                  opening_views=opening_views,
                  view_notify=max(0.0, centre(views, views_at)) if views_apart and views else None)


def sampled(delays: Delays, samples: dict[str, list[float]], seed: int) -> Delays:
    """``delays`` drawing each delay from the live run's samples of it (seeded): their jitter and tails, not
    only their means. A launch's time is the fitted line times a drawn factor (a launch's measured time over
    the line's value at its nodes); so is a rigid job's exit when it is a line in its nodes
    (``exit_per_node``), else it is drawn from the launch-and-exit samples (``work_overhead``), as its
    constant is their mean."""
    per_node = delays.exit_per_node > 0 or delays.exit_per_launching > 0
    pools = {k: tuple(max(0.0, v) for v in samples.get(src, ())) for k, src in
             (("notify", "notify"), ("command", "command"), ("reply", "reply"), ("open", "open"),
              *((("exit", "work_overhead"),) if not per_node else ()),
              *((("view_notify", views_source(samples)),) if delays.view_notify is not None else ()))}
    pools["launch_factor"] = factors(samples.get("launch_nodes", []), samples.get("launch", []),
                                     delays.launch, delays.launch_per_node)
    if per_node:
        line = [delays.exit + delays.exit_per_node * n + delays.exit_per_launching * k for n, k in
                zip(samples.get("work_overhead_nodes", []),
                    samples.get("work_overhead_launching", [0.0] * len(samples.get("work_overhead", []))),
                    strict=False)]
        pools["exit_factor"] = tuple(max(0.0, t) / x for t, x in zip(samples.get("work_overhead", []), line,
                                                                     strict=False) if x > 0)
    return replace(delays, samples=tuple((k, v) for k, v in pools.items() if v), seed=seed)


def factors(nodes: list[float], times: list[float], a: float, b: float) -> tuple[float, ...]:
    """Each measured time over the line ``a + b x nodes`` at its nodes."""
    return tuple(max(0.0, t) / x for t, x in zip(times, (a + b * n for n in nodes), strict=False) if x > 0)


def least_squares(rows: list[list[float]], y: list[float]) -> list[float]:
    """The coefficients ``c`` minimising ``sum((row . c - y)^2)`` (the normal equations, solved by Gaussian
    elimination; a column that does not vary gets 0)."""
    k = len(rows[0])
    m = [[sum(r[i] * r[j] for r in rows) for j in range(k)] + [sum(r[i] * v for r, v in zip(rows, y, strict=True))]
         for i in range(k)]
    for i in range(k):
        p = max(range(i, k), key=lambda r: abs(m[r][i]))
        m[i], m[p] = m[p], m[i]
        if abs(m[i][i]) < 1e-12:
            continue
        for r in range(k):
            if r != i:
                q = m[r][i] / m[i][i]
                m[r] = [a - q * b for a, b in zip(m[r], m[i], strict=True)]
    return [m[i][k] / m[i][i] if abs(m[i][i]) >= 1e-12 else 0.0 for i in range(k)]


def plane(rows: list[list[float]], y: list[float]) -> list[float]:
    """:func:`least_squares` with every slope >= 0 (a delay does not shrink with load): a slope fitted below
    0 is left out and the rest fitted again (the fit's mean stays the samples')."""
    keep = list(range(len(rows[0])))
    while True:
        c = least_squares([[r[i] for i in keep] for r in rows], y)
        out = [0.0] * len(rows[0])
        for i, v in zip(keep, c, strict=True):
            out[i] = v
        negative = [i for i in keep[1:] if out[i] < 0]
        if not negative:
            return out
        keep.remove(min(negative, key=lambda i: out[i]))


def mean_line(x: list[float], y: list[float], quantile: float | None = None) -> tuple[float, float]:
    """:func:`fit_line`'s line scaled to ``y``'s mean over ``x`` (the delays add up over a run: the tails
    count, as for the constants); ``quantile``: to that quantile of ``y`` (:func:`centre`)."""
    a, b = fit_line(x, y)
    if y:
        line_mean = statistics.fmean(a + b * n for n in x) if x else a
        if line_mean > 0:
            scale = centre(y, quantile) / line_mean
            a, b = a * scale, b * scale
    return a, b


def scaled(delays: Delays, factor: float) -> Delays:
    """``delays`` with every delay (not the view pacing) ``factor`` times as long."""
    views = None if delays.view_notify is None else delays.view_notify * factor
    return replace(delays, view_notify=views, notify=delays.notify * factor, command=delays.command * factor,
                   reply=delays.reply * factor,
                   launch=delays.launch * factor, launch_per_node=delays.launch_per_node * factor,
                   exit=delays.exit * factor, exit_per_node=delays.exit_per_node * factor,
                   exit_per_launching=delays.exit_per_launching * factor,
                   open=delays.open * factor)


def fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """A robust line ``y = a + b x`` (``b`` 0 when ``x`` does not vary)."""
    if not y:
        return 0.0, 0.0
    if len(set(x)) < 2:
        return statistics.median(y), 0.0
    # Theil-Sen: the median of the pairwise slopes -- the launches that waited behind a loaded agent (seconds
    # where the median is a tenth) would pull a least-squares line
    slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(len(x)) for j in range(i + 1, len(x)) if x[j] != x[i]]
    slope = statistics.median(slopes)
    return statistics.median(yi - slope * xi for xi, yi in zip(x, y, strict=True)), slope


def simulate(specs: list[TwinApp], clusters: dict[str, int], settings: PolicySettings,
             delays: Delays | None = None, start_lag: float = 0.0, pins: dict[str, Pin] | None = None) -> SimRun:
    """``specs`` in the simulator; ``start_lag``: the moldable and CEM launchers' (the live run's, for a
    simulator calibrated from it: live, a new choice made on a view that no longer shows the waited
    configuration where it was expected waits that long for a start not heard yet; 0, the papers').
    ``pins``: the moldable and CEM applications held to these configurations (:func:`pins`)."""
    sim = Simulation(clusters, settings, props(clusters), strict=False, delays=delays)
    pins = pins or {}
    for s in specs:
        sim.add(s.at, launcher(s, s.name, live=False, start_lag=start_lag, pin=pins.get(s.name)), s.name,
                process_work=s.process_work)
    t0 = time.process_time()
    result = sim.run()
    cpu = time.process_time() - t0
    requests = [{"name": r.app, "request": r.request, "type": r.type, "cluster": r.cluster, "nodes": r.nodes,
                 "start": r.start, "end": r.end} for r in result.requests]
    return SimRun(result, requests, cpu)


def node_seconds(requests: list[dict], name: str, until: float) -> float:
    """Node-seconds ``name`` held (its pre-allocations aside: its nodes are counted in the requests inside)."""
    return sum(r["nodes"] * ((r["end"] if r["end"] is not None else until) - r["start"])
               for r in requests if r["name"] == name and r["start"] is not None
               and r["type"] != RequestType.PRE_ALLOCATION.value)


def held_curve(requests: list[dict], until: float, step: float = 0.5) -> list[int]:
    """Nodes held (pre-allocations aside) at each ``step`` from 0 to ``until``."""
    n = int(until / step) + 1
    curve = [0] * n
    for r in requests:
        if r["start"] is None or r["type"] == RequestType.PRE_ALLOCATION.value:
            continue
        end = r["end"] if r["end"] is not None else until
        for i in range(max(0, int(r["start"] / step + 0.999999)), min(n, int(end / step + 0.999999))):
            curve[i] += r["nodes"]
    return curve


def pins(specs: list[TwinApp], requests: list[dict]) -> dict[str, Pin]:
    """The configuration each moldable and CEM application of ``specs`` started in (:func:`first_choice`'s
    requests, with their clusters, the first submitted first): what the live run chose, to hold a simulation
    to. A run stored before its requests' clusters were (none of a CEM's has one) pins its moldables only: a
    moldable's cluster is its own."""
    out: dict[str, Pin] = {}
    for s in specs:
        if s.kind not in ("moldable", "cem"):
            continue
        group = first_group(requests, s.name)
        if not group:
            continue
        if s.kind == "moldable":
            out[s.name] = ((s.cluster, sum(r["nodes"] for r in group)),)
        elif all(r.get("cluster") for r in group):
            out[s.name] = tuple((r["cluster"], r["nodes"]) for r in group)
    return out


def first_group(requests: list[dict], name: str) -> list[dict]:
    """The requests ``name`` started first (pre-allocations aside, and a request that ended as it started: one
    it had cancelled as it started), those started within 0.5 s of the first, in the order submitted."""
    started = [r for r in requests if r["name"] == name and r["start"] is not None
               and r["type"] != RequestType.PRE_ALLOCATION.value
               and (r["end"] is None or r["end"] - r["start"] > 0.5)]
    if not started:
        return []
    first = min(r["start"] for r in started)
    return sorted((r for r in started if r["start"] - first < 0.5),
                  key=lambda r: (r.get("submitted") if r.get("submitted") is not None else r["start"],
                                 _order(r["request"])))


def _order(request: str) -> tuple:
    """A request id's order among its application's (``root.a3.12`` after ``root.a3.2``)."""
    return tuple(int(p) if p.isdigit() else p for p in request.replace("-", ".").split("."))


def first_choice(requests: list[dict], name: str) -> int | None:
    """The nodes of the requests ``name`` started first (pre-allocations aside, and a request that ended as it
    started): the configuration a moldable or CEM launcher chose."""
    group = first_group(requests, name)
    return sum(r["nodes"] for r in group) if group else None
