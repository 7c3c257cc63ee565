"""``coorm demo``: the main job. On the embedded default (``coorm up``'s servers, services and agents), a mixed
workload runs live for about two minutes -- rigid jobs, a moldable and a CEM launcher, a PSA, an AMR -- each
through the very launcher objects the simulator runs, with real processes on the emulated nodes. A progress
display while it runs; then a per-application table and a PNG of utilisation by request type over time."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from coorm.cli.up import Up
from coorm.launchers.base import Launcher
from coorm.launchers.live import LiveRunner, RunResult
from coorm.launchers.sdk import Session
from coorm.shared import bus, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import StatusQuery, StatusReply
from coorm.shared.settings import Settings

CLUSTERS = {"c0": 16, "c1": 16}
DEMO_ENV = {"COORM_RESCHEDULE_INTERVAL": "0.2", "COORM_FAIR_START": "1", "COORM_PREEMPT_GRACE": "3",
            "COORM_KILL_GRACE": "1", "COORM_LOG_LEVEL": "WARNING"}


@dataclass
class Entry:
    name: str
    kind: str
    at: float
    make: object  # (app id, cluster props) -> Launcher
    command: list[str] | None
    ends_work: bool
    background: bool = False
    app: str = ""
    submitted: float | None = None
    result: RunResult | None = None
    launcher: Launcher | None = None
    runner: LiveRunner | None = None
    task: asyncio.Task | None = None


@dataclass
class Sample:
    t: float
    per: dict[str, dict[str, int]] = field(default_factory=dict)


def workload() -> list[Entry]:
    from coorm.launchers.amr import AMRLauncher
    from coorm.launchers.cem import CEMLauncher, CEMModel
    from coorm.launchers.moldable import MoldableLauncher
    from coorm.launchers.psa import PSALauncher
    from coorm.launchers.rigid import RigidLauncher

    def rigid(cluster, n, walltime):
        return lambda app, props: RigidLauncher(app, cluster, n, walltime)

    jobs = [
        Entry("amr", "amr", 0.0, lambda app, props: AMRLauncher(app, "c0", smax_mib=10 * 4096.0, steps=6, seed=3,
                                                                 announce_interval=0.0),
              ["sleep", "600"], False),
        Entry("psa", "psa", 1.0, lambda app, props: PSALauncher(app, "c0", task_duration=6.0), ["sleep", "600"],
              False, background=True),
        Entry("rigid-1", "rigid", 2.0, rigid("c1", 8, 60), ["sleep", "20"], True),
        Entry("rigid-2", "rigid", 4.0, rigid("c1", 6, 60), ["sleep", "30"], True),
        Entry("rigid-3", "rigid", 6.0, rigid("c0", 4, 60), ["sleep", "15"], True),
        Entry("moldable", "moldable", 10.0,
              lambda app, props: MoldableLauncher(app, "c1", [(4, 60), (8, 40), (16, 25)]), ["sleep", "20"], True),
        Entry("rigid-4", "rigid", 20.0, rigid("c1", 10, 60), ["sleep", "25"], True),
        Entry("cem", "cem", 30.0, lambda app, props: CEMLauncher(app, model=CEMModel(iterations=40, work=20.0)),
              ["sleep", "20"], True),
        Entry("rigid-5", "rigid", 45.0, rigid("c0", 6, 60), ["sleep", "20"], True),
        Entry("rigid-6", "rigid", 60.0, rigid("c1", 12, 60), ["sleep", "20"], True),
    ]
    return jobs


async def _sample(nc, t0: float) -> Sample | None:
    try:
        st = await bus.call(nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply, timeout=2)
    except Exception:  # noqa: BLE001 - a missed sample is a gap in the plot
        return None
    return Sample(time.time() - t0, {c.cluster: {"non-preemptible": c.non_preemptible,
                                                 "pre-allocated unused": c.pre_allocated_unused,
                                                 "preemptible": c.preemptible, "fair-start held": c.held,
                                                 "idle": c.idle} for c in st.clusters})


def _table(entries: list[Entry], t0: float, final: bool = False) -> Table:
    now = time.time()
    t = Table(title="CooRM demo" + ("" if final else f" — {now - t0:5.1f} s"))
    for col in ("app", "name", "kind", "submitted", "started", "ended", "exit", "state", "notifications"):
        t.add_column(col, justify="right" if col in ("submitted", "started", "ended", "exit", "notifications")
                     else "left")

    def rel(x):
        return "-" if x is None else f"{x - t0:.1f}"

    for e in entries:
        r = e.result or (e.runner.result if e.runner else None)
        if e.task is None:
            state = "to come"
        elif not e.task.done():
            lz = e.launcher
            held = sum(len(v) for v in lz.running.values()) if lz else 0
            state = f"running on {held}" if held else "waiting"
        else:
            state = "done" if r and r.exit_code == 0 and not r.end_reason else f"ended ({r.end_reason or 'exit'})"
        # (every application is this user's: the id without its user fits the column)
        t.add_row(e.app.split(".", 1)[-1] if e.app else "-", e.name, e.kind, rel(e.submitted),
                  rel(r.started if r else None),
                  rel(r.ended if r and e.task and e.task.done() else None),
                  "-" if not (r and e.task and e.task.done()) else str(r.exit_code), state,
                  "-" if not e.runner else f"{e.runner.s.stats.notifications}")
    return t


async def _run_entry(e: Entry, settings: Settings) -> None:
    from coorm.launchers.kinds import BY_NAME

    session = await Session.open(settings, kind=e.kind, name=e.name, preemptive_views=BY_NAME[e.kind].preemptive_views)
    e.app = session.app
    e.submitted = time.time()
    props = await session.cluster_props()
    e.launcher = e.make(session.app, props)
    e.runner = LiveRunner(session, e.launcher, command=e.command, command_ends_work=e.ends_work)
    e.result = await e.runner.run()


async def run_workload(settings: Settings, entries: list[Entry], console: Console, limit: float) -> list[Sample]:
    nc = await bus.connect(settings.nats_url, "coorm-demo", settings.identity(Role.LAUNCHER))
    samples: list[Sample] = []
    t0 = time.time()
    try:
        with Live(_table(entries, t0), console=console, refresh_per_second=2, transient=False) as live:
            while True:
                now = time.time() - t0
                for e in entries:
                    if e.task is None and now >= e.at:
                        e.task = asyncio.create_task(_run_entry(e, settings))
                fg = [e for e in entries if not e.background]
                if all(e.task is not None and e.task.done() for e in fg) or now > limit:
                    break
                s = await _sample(nc, t0)
                if s:
                    samples.append(s)
                live.update(_table(entries, t0))
                await asyncio.sleep(0.5)  # the display's and the sampling's period
            # the PSA runs for as long as there is room: the demo ends its session now
            for e in entries:
                if e.task is not None and not e.task.done() and e.runner is not None:
                    await e.runner.s.close()
            await asyncio.wait([e.task for e in entries if e.task], timeout=20)
            live.update(_table(entries, t0, final=True))
    finally:
        await bus.shutdown(nc)
    for e in entries:
        if e.task is not None and e.task.done() and e.task.exception() is not None:
            console.print(f"[red]{e.name} failed:[/red] {e.task.exception()!r}")
    return samples


def plot(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = ["non-preemptible", "pre-allocated unused", "preemptible", "fair-start held", "idle"]
    colours = ["#1f77b4", "#aec7e8", "#ff7f0e", "#c5b0d5", "#eeeeee"]
    clusters = sorted({c for s in samples for c in s.per})
    fig, axes = plt.subplots(len(clusters), 1, figsize=(9, 2.6 * len(clusters)), sharex=True, squeeze=False)
    for ax, c in zip(axes[:, 0], clusters, strict=True):
        ts = [s.t for s in samples if c in s.per]
        ys = [[s.per[c][k] for s in samples if c in s.per] for k in kinds]
        ax.stackplot(ts, ys, labels=kinds, colors=colours, step="post")
        ax.set_ylabel(f"{c}: nodes")
        ax.set_ylim(0, max((sum(s.per[c].values()) for s in samples if c in s.per), default=1))
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("seconds since the demo started")
    fig.suptitle("CooRM live demo: utilisation by request type")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(console: Console, out: Path, limit: float = 180.0) -> int:
    entries = workload()
    with console.status("starting the embedded default: nats-server, valkey-server, services, agents..."):
        up = Up(CLUSTERS, env=DEMO_ENV, write_connection=False)
        try:
            settings = up.start()
        except Exception as e:
            up.stop()
            console.print(f"[red]could not start the embedded system:[/red] {e}")
            return 1
    console.print(f"embedded CooRM up: {', '.join(f'{c}={n}' for c, n in CLUSTERS.items())} nodes; logs in "
                  f"{up.log_dir}")
    try:
        samples = asyncio.run(run_workload(settings, entries, console, limit))
    finally:
        up.stop()
    png = out / "utilisation.png"
    if samples:
        plot(samples, png)
        console.print(f"wrote {png}")
    failed = [e.name for e in entries if not e.background and (e.result is None or e.result.exit_code != 0)]
    if failed:
        console.print(f"[red]did not complete cleanly:[/red] {', '.join(failed)}")
        return 1
    console.print("every application completed")
    return 0
