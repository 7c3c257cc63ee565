"""The ``coorm`` commands that talk to a running system: services, agents, submit, launch, status...

Every command finds the system through :class:`coorm.shared.settings.Settings`: ``COORM_*`` variables, else the
connection file ``coorm up`` wrote, else the defaults."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from coorm.cli.table import fmt_time, human
from coorm.launchers.kinds import BY_NAME
from coorm.shared.settings import Settings
from coorm.shared.when import parse_walltime  # noqa: F401 - (the command line's, re-exported)

err = Console(stderr=True)

SERVICES = ("policy-engine", "node-allocator", "view-publisher", "accounting", "batch")


# ================================================================================================
# parsing what users type
# ================================================================================================
def _settings() -> Settings:
    return Settings()


_fmt_time, _human = fmt_time, human  # (the names this module and its importers use)


UNREACHABLE = 3  # the exit code of a command that could not reach CooRM (or lost it), as documented


def _line(text: str) -> None:
    """One line on stderr, whatever the terminal's width (a script greps it)."""
    sys.stderr.write(f"coorm: {text}\n")
    sys.stderr.flush()


def _failure(e: BaseException, settings: Settings, say=_line) -> typer.Exit:
    """What a client command says when talking to CooRM failed, and its exit code: 3 when CooRM cannot be
    reached or does not answer, 2 when it refused. Anything else is a bug and keeps its traceback."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    from coorm.shared import bus
    from coorm.shared.credentials import CredentialsError

    url = f"{bus.redact(settings.nats_url)} (from {settings.source_of('nats_url')})"
    if isinstance(e, bus.Unreachable):
        say(str(e))
    elif isinstance(e, bus.Refused | CredentialsError):
        say(str(e))
        return typer.Exit(2)
    elif isinstance(e, NoRespondersError):
        say(f"NATS at {url} answers but no CooRM service does: is the policy engine running? "
            "Start one with 'coorm up'")
    elif isinstance(e, NatsTimeout | TimeoutError):
        say(f"CooRM at {url} did not answer in time")
    elif isinstance(e, bus.WireError):
        say(f"refused: {e.message}")
        return typer.Exit(2)
    elif _redis_unreachable(e):
        from coorm.shared.bus import redact

        say(f"cannot reach CooRM's Redis at {redact(settings.redis_url)} (from {settings.source_of('redis_url')}) "
            f"within {settings.connect_timeout:g} s: is it running? Start one with 'coorm up'")
    else:
        raise e
    return typer.Exit(UNREACHABLE)


def _redis_unreachable(e: BaseException) -> bool:
    if "redis" not in sys.modules:
        return False
    import redis

    return isinstance(e, redis.ConnectionError | redis.TimeoutError)


def run(coro):
    """``asyncio.run(coro)``'s result, kept out of the main task: on Python 3.11 ``asyncio.run`` ends by
    reading the SIGINT handler back (``signal.getsignal``), which formats the handler -- a partial holding
    the main task -- and so the task's result: 2 s of pydantic ``repr`` for a 10,000-job queue."""
    box: list = []

    async def main() -> None:
        box.append(await coro)

    asyncio.run(main())
    return box[0]


async def _connect(settings: Settings, name: str = "coorm-cli"):
    from coorm.shared import bus
    from coorm.shared.endpoints import Role

    return await bus.connect_client(settings.nats_url, name, timeout=settings.connect_timeout,
                                    reconnect_window=settings.reconnect_window,
                                    source=settings.source_of("nats_url"), identity=settings.identity(Role.LAUNCHER))


async def _call(nc, settings: Settings, subject: str, message, reply, *, timeout: float,
                within: float | None = None, identity=None, query: bool = True):
    """``bus.call_moving``, as the light path asks: a request nobody serves through ``nc``'s server is sent
    again, through another server of the list when one has it answered, for ``within`` seconds (the light
    path's ``RETRY_NO_RESPONDERS`` by default); a ``query`` (safe to send twice) unanswered after
    ``RESEND_AFTER`` is sent again too."""
    from coorm.cli.fast import RESEND_AFTER, RETRY_NO_RESPONDERS
    from coorm.shared import bus
    from coorm.shared.connection import nats_servers
    from coorm.shared.endpoints import Role

    return await bus.call_moving(nc, nats_servers(settings.nats_url), subject, message, reply, timeout=timeout,
                                 within=RETRY_NO_RESPONDERS if within is None else within, name="coorm-cli",
                                 identity=identity or settings.identity(Role.LAUNCHER),
                                 resend_after=RESEND_AFTER if query else None)


def _redis(settings: Settings):
    """A Redis client that gives up as a NATS client does (redis-py would wait for the OS's timeout)."""
    from coorm.shared.valkey import sync_client

    return sync_client(settings.redis_url, decode_responses=True,
                                socket_connect_timeout=settings.connect_timeout,
                                socket_timeout=max(settings.connect_timeout, 10.0))


# ================================================================================================
# services and agents
# ================================================================================================
def run_service(name: str) -> None:
    from coorm.services.runtime import configure_logging

    settings = _settings()
    configure_logging(os.environ.get("COORM_LOG_LEVEL", "INFO"))
    if name == "policy-engine":
        from coorm.services.policy_engine.service import main
    elif name == "node-allocator":
        from coorm.services.node_allocator.service import main
    elif name == "view-publisher":
        from coorm.services.view_publisher.service import main
    elif name == "accounting":
        from coorm.services.accounting.service import main
    elif name == "batch":
        from coorm.services.batch.service import main
    else:
        err.print(f"[red]unknown service {name!r}[/red]: one of {', '.join(SERVICES)}")
        raise typer.Exit(2)
    asyncio.run(main(settings))


def run_agent(cluster: str, nodes: str, agent_id: str | None, cores: int | None, memory_mb: int | None) -> None:
    from coorm.node_agent.agent import main
    from coorm.services.runtime import configure_logging

    configure_logging(os.environ.get("COORM_LOG_LEVEL", "INFO"))
    main(cluster, nodes, agent_id=agent_id, cores=cores, memory_mb=memory_mb)


# ================================================================================================
# submit: a rigid job, the way srun / sbatch feel
# ================================================================================================
def submit(cluster: str, nodes: int, walltime: str, command: list[str], output: Path | None, label: bool,
           name: str) -> None:
    try:
        duration = parse_walltime(walltime)
    except ValueError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    if not command:
        err.print("[red]nothing to run[/red]: coorm submit -c CLUSTER -N NODES -t TIME -- COMMAND ARGS...")
        raise typer.Exit(2)
    code = asyncio.run(_submit(_settings(), cluster, nodes, duration, command, output, label, name))
    raise typer.Exit(code)


def _where_and_how() -> dict:
    """As ``srun`` does: the command runs in this directory, with this environment (the agent starts it as
    this user, over the user's own HOME, USER, SHELL; a variable the operator denies refuses the launch)."""
    return {"env": dict(os.environ), "cwd": os.getcwd()}


async def _submit(settings: Settings, cluster: str, nodes: int, duration: float, command: list[str],
                  output: Path | None, label: bool, name: str, say=_line) -> int:
    from coorm.launchers.live import LiveRunner
    from coorm.launchers.rigid import RigidLauncher
    from coorm.launchers.sdk import RMSStopped, Session, SessionReaped
    from coorm.shared import bus

    try:
        session = await Session.open(settings, kind="rigid", name=name or Path(command[0]).name,
                                     preemptive_views=False, views=False)
    except Exception as e:  # noqa: BLE001 - _failure re-raises what is not about reaching CooRM
        raise _failure(e, settings, say) from None
    sink = open(output, "a", buffering=1) if output else None  # noqa: SIM115 - closed below

    def show(out) -> None:
        text = out.data if not label else "".join(f"{out.node}: {line}\n" for line in out.data.splitlines())
        stream = sink or (sys.stdout if out.stream == "stdout" else sys.stderr)
        stream.write(text)
        stream.flush()

    launcher = RigidLauncher(session.app, cluster, nodes, duration)
    runner = LiveRunner(session, launcher, command=command, command_ends_work=True, on_output=show,
                        **_where_and_how())
    try:
        result = await runner.run()
    except bus.WireError as e:
        err.print(f"[red]refused:[/red] {e.message}")
        return 2
    except bus.Unreachable as e:  # lost for good: what became of the job is unknown here
        say(f"{e}; job {session.app} may still run: see 'coorm requests' once CooRM is back")
        return UNREACHABLE
    except RMSStopped as e:  # its processes are being killed: the job did not complete
        say(f"{e}; job {session.app} is killed")
        return UNREACHABLE
    except SessionReaped as e:  # ended while this command could not hear: the job did not complete
        err.print(f"[red]job {session.app}: {e}[/red]")
        return 1
    finally:
        if sink:
            sink.close()
    if result.refused:
        err.print(f"[red]refused:[/red] {result.refused[0]}")
    if result.end_reason:
        from coorm.shared.protocol import AGENT_KILL_REASONS

        why = AGENT_KILL_REASONS.get(result.end_reason) or f"ended by the RMS: {result.end_reason}"
        err.print(f"[red]job {session.app}: {why}[/red]")
        if result.exit_code == 0:
            return 124 if result.end_reason == "walltime" else 1
    return result.exit_code


# ================================================================================================
# launch: any shipped launcher, live
# ================================================================================================
def launch(kind: str, cluster: str | None, params: list[str], command: list[str], name: str) -> None:
    from pydantic import TypeAdapter, ValidationError

    from coorm.simulator.scenario import AppSpec

    spec: dict = {"kind": kind}
    if cluster:
        spec["cluster"] = cluster
    for p in params:
        if "=" not in p:
            err.print(f"[red]--set takes KEY=VALUE, not {p!r}[/red]")
            raise typer.Exit(2)
        k, v = p.split("=", 1)
        try:
            spec[k] = json.loads(v)
        except ValueError:
            spec[k] = v
    try:
        app_spec = TypeAdapter(AppSpec).validate_python(spec)
    except ValidationError as e:
        err.print(f"[red]bad parameters for a {kind} launcher:[/red] {e}")
        raise typer.Exit(2) from None
    code = asyncio.run(_launch(_settings(), app_spec, command, name))
    raise typer.Exit(code)


async def _launch(settings: Settings, app_spec, command: list[str], name: str) -> int:
    from coorm.launchers.live import LiveRunner
    from coorm.launchers.sdk import Session, SessionReaped
    from coorm.shared import bus
    from coorm.simulator.scenario import make_launcher

    try:
        kind = BY_NAME[app_spec.kind]
        session = await Session.open(settings, kind=kind.name, name=name or kind.name,
                                     preemptive_views=kind.preemptive_views, views=kind.live_views)
    except Exception as e:  # noqa: BLE001 - _failure re-raises what is not about reaching CooRM
        raise _failure(e, settings) from None
    props = await session.cluster_props()
    if not props.nodes:
        err.print("[red]no cluster is up[/red]")
        await session.close()
        return 3
    default = sorted(props.nodes)[0]
    launcher = make_launcher(session.app, app_spec, default, props)
    err.print(f"[bold]{session.app}[/bold]: {app_spec.kind} launcher running (Ctrl-C ends the session)")
    ends_work = BY_NAME[app_spec.kind].command_is_work and bool(command)
    runner = LiveRunner(session, launcher, command=command or None, command_ends_work=ends_work,
                        on_output=lambda o: sys.stdout.write(o.data), **_where_and_how())
    try:
        result = await runner.run()
    except bus.Unreachable as e:
        _line(f"{e}; application {session.app} may still run: see 'coorm apps' once CooRM is back")
        return UNREACHABLE
    except SessionReaped as e:
        err.print(f"[red]{e}[/red]")
        return 1
    stats = launcher.stats() if hasattr(launcher, "stats") else {}
    err.print(f"{session.app} ended: exit {result.exit_code}, notifications {result.notifications} "
              f"({result.notification_bytes} bytes)" + (f", {stats}" if stats else ""))
    return result.exit_code


# ================================================================================================
# status, nodes, apps, requests, estimate
# ================================================================================================
PAGE = 1000  # applications and requests per status reply (one reply must fit in a NATS message)


async def _status(settings: Settings, *, everything: bool = True, within: float | None = None):
    """The status; with ``everything``, every application and request (page after page), else the counts
    only. Nobody serving it is waited for ``within`` seconds (:func:`_call`)."""
    from coorm.shared import bus, subjects
    from coorm.shared.protocol import StatusQuery, StatusReply

    nc = await _connect(settings)
    try:
        st = await _call(nc, settings, subjects.QUERY_STATUS, StatusQuery(limit=PAGE if everything else 0),
                         StatusReply, timeout=5, within=within)
        offset = PAGE
        while everything and (len(st.apps) < st.total_apps or len(st.requests) < st.total_requests):
            page = await _call(nc, settings, subjects.QUERY_STATUS, StatusQuery(offset=offset, limit=PAGE),
                               StatusReply, timeout=5, within=within)
            if not page.apps and not page.requests:
                break  # (fewer than when the first page was read)
            st.apps += page.apps
            st.requests += page.requests
            offset += PAGE
        return st
    finally:
        await bus.shutdown(nc)


def fetch_status(everything: bool = True):
    settings = _settings()
    try:
        return run(_status(settings, everything=everything))
    except Exception as e:  # noqa: BLE001 - _failure re-raises what is not about reaching CooRM
        raise _failure(e, settings) from None


def show_status(as_json: bool) -> None:
    st = fetch_status(everything=False)
    if as_json:
        print(json.dumps({"now": st.now, "epoch": st.epoch, "leader": st.leader,
                          "clusters": [c.model_dump() for c in st.clusters],
                          "apps": st.total_apps, "waiting": st.waiting, "running": st.running}, indent=2))
        return
    t = Table(title=f"CooRM — epoch {st.epoch}, leader {st.leader}")
    for col in ("cluster", "up", "non-preemptible", "pre-allocated unused", "preemptible", "fair-start held",
                "idle"):
        t.add_column(col, justify="left" if col == "cluster" else "right")
    for c in st.clusters:
        t.add_row(c.cluster, str(c.up), str(c.non_preemptible), str(c.pre_allocated_unused), str(c.preemptible),
                  str(c.held), str(c.idle))
    Console().print(t)
    Console().print(f"{st.total_apps} applications, {st.running} requests running, {st.waiting} waiting")


def show_apps(as_json: bool) -> None:
    st = fetch_status()
    if as_json:
        print(json.dumps([a.model_dump() for a in st.apps], indent=2))
        return
    t = Table(title="applications (priority order)")
    for col in ("app", "user", "name", "kind", "opened", "running", "waiting", "nodes"):
        t.add_column(col, justify="right" if col in ("running", "waiting", "nodes") else "left")
    for a in sorted(st.apps, key=lambda a: a.opened):
        t.add_row(a.app, a.user, a.name, a.kind, _fmt_time(a.opened, st.now), str(a.running), str(a.waiting),
                  str(a.nodes))
    Console().print(t)


def show_requests(as_json: bool, app: str | None) -> None:
    st = fetch_status()
    rows = [r for r in st.requests if app is None or r.app == app]
    if as_json:
        print(json.dumps([r.model_dump() for r in rows], indent=2))
        return
    t = Table(title="requests")
    for col in ("app", "request", "type", "cluster", "nodes", "state", "start", "end", "relation"):
        t.add_column(col, justify="right" if col == "nodes" else "left")
    for r in sorted(rows, key=lambda r: (r.state != "started", r.start if r.start is not None else 1e30)):
        state = r.state + (" (blocked)" if r.blocked else "")
        rel = f"{r.related_how} {r.related_to}" if r.related_to else ""
        cluster = r.cluster or f"({r.placement})"  # (the RMS has not chosen it yet)
        if r.cluster and r.placement:
            cluster += f" ({r.placement})"
        t.add_row(r.app, r.request, r.type, cluster, str(r.nodes), state, _fmt_time(r.start, st.now),
                  "-" if r.end is None else _fmt_time(r.end, st.now), rel)
    Console().print(t)


def show_nodes(as_json: bool) -> None:
    from coorm.shared import keys

    settings = _settings()
    try:
        r = _redis(settings)
        raw = r.hgetall(keys.NODES)
        drains = r.hgetall(keys.NODE_DRAINS)
    except Exception as e:  # noqa: BLE001 - _failure re-raises what is not about reaching CooRM
        raise _failure(e, settings) from None
    for n, why in drains.items():  # the operator's drain: it shows whatever the agent's state
        if n in raw:
            rec = json.loads(raw[n])
            busy = rec.get("request")
            raw[n] = json.dumps({**rec, "state": f"{rec['state']}+draining" if busy else "drained", "reason": why})
    nodes = sorted(((n, json.loads(v)) for n, v in raw.items()), key=lambda x: (x[1]["cluster"], _natural(x[0])))
    if as_json:
        print(json.dumps({n: rec for n, rec in nodes}, indent=2))
        return
    t = Table(title=f"{len(nodes)} nodes")
    for col in ("node", "cluster", "state", "agent", "cores", "memory (MB)", "app", "request", "reason"):
        t.add_column(col)
    for n, rec in nodes:
        t.add_row(n, rec["cluster"], rec["state"], rec["agent"], str(rec["cores"]), str(rec["memory_mb"]),
                  rec.get("app") or "", rec.get("request") or "", rec.get("reason") or "")
    Console().print(t)


def node_drain(nodes: list[str], reason: str, *, drain: bool) -> None:
    """``coorm node drain/resume``: an operator's command (it needs the services' identity, which only the
    operator's credential store holds: NATS lets no user publish on the subject)."""
    from coorm.shared import bus, keys, subjects
    from coorm.shared.endpoints import Role
    from coorm.shared.protocol import Ack, NodesEvent

    settings = _settings()
    try:
        raw = _redis(settings).hgetall(keys.NODES)
    except Exception as e:  # noqa: BLE001 - _failure re-raises what is not about reaching CooRM
        raise _failure(e, settings) from None
    clusters: dict[str, list[str]] = {}
    for n in nodes:
        if n not in raw:
            err.print(f"[red]no node {n!r}[/red]")
            raise typer.Exit(2)
        clusters.setdefault(json.loads(raw[n])["cluster"], []).append(n)
    ident = settings.identity(Role.SERVICE)
    if ident is None:
        err.print("[red]draining nodes is the operator's: this account has not the services' identity[/red]")
        raise typer.Exit(2)

    async def send() -> None:
        nc = await bus.connect_client(settings.nats_url, "coorm-node", timeout=settings.connect_timeout,
                                      reconnect_window=settings.reconnect_window,
                                      source=settings.source_of("nats_url"), identity=ident)
        try:
            for cluster, ns in clusters.items():
                # (sent again when unanswered, as a query: draining a drained node changes nothing)
                await _call(nc, settings, subjects.NODES_EVENT, NodesEvent(
                    kind="drain" if drain else "resume", cluster=cluster, nodes=ns, reason=reason), Ack,
                    timeout=10, identity=ident)
        finally:
            await bus.shutdown(nc)

    try:
        asyncio.run(send())
    except Exception as e:  # noqa: BLE001 - _failure re-raises what is not about reaching CooRM
        raise _failure(e, settings) from None
    print(f"{'drained' if drain else 'resumed'}: {', '.join(nodes)}")


def _natural(s: str):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)]


def estimate(cluster: str, nodes: int, walltime: str, as_json: bool) -> None:
    """When a request would start if sent now: read from a fresh session's non-preemptive view (the
    session sees what a new application -- the lowest priority -- would see)."""
    try:
        duration = parse_walltime(walltime)
    except ValueError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    settings = _settings()

    async def go():
        from coorm.launchers.sdk import Session

        try:
            s = await Session.open(settings, kind="estimate", name="coorm estimate", preemptive_views=False)
        except Exception as e:  # noqa: BLE001 - _failure re-raises what is not about reaching CooRM
            raise _failure(e, settings) from None
        try:
            views = await s.wait_views(10)
        finally:
            await s.close()
        return views

    views = run(go())
    view = views.non_preemptive.get(cluster)
    if view is None:
        err.print(f"[red]no cluster {cluster!r}[/red] (known: {', '.join(sorted(views.non_preemptive)) or 'none'})")
        raise typer.Exit(2)
    start = view.earliest_fit(nodes, duration, views.now) if nodes <= view.max_value() else float("inf")
    when = None if start == float("inf") else start
    if as_json:
        print(json.dumps({"cluster": cluster, "nodes": nodes, "walltime": duration, "now": views.now,
                          "start": when, "wait": None if when is None else when - views.now}))
        return
    if when is None:
        print(f"{nodes} nodes of {cluster} never fit: the cluster has {view.max_value()} at most")
    else:
        print(f"{nodes} nodes of {cluster} for {_human(duration)}: would start at {_fmt_time(when, views.now)}")

