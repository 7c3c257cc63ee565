"""``coorm up``: the embedded default. A local nats-server (JetStream on disk) and valkey-server (append-only
file) on free ports, every service -- the policy engine twice: a leader and a standby -- and one agent per
cluster as child processes, the connection settings written where every other ``coorm`` command of this
user finds them; in the foreground until Ctrl-C, then everything stops.

It supervises its children (:mod:`coorm.cli.supervise`): one that dies, servers included, is started again
on the same ports and data after a back-off, and the restart is logged (on the console and in
``<workdir>/supervisor.log``; ``<workdir>/pids.json`` says which pid each child has now). A child that keeps
dying (more than 5 times within a minute) cannot be repaired: everything stops and ``coorm up`` exits 1,
the reason on one line. Ctrl-C or SIGTERM, even while it starts, is a clean stop (exit 0). When it stops,
every connected application is told why (``SystemStopping``) before the services, the agents and the
servers go.

Data survive a server's death: valkey writes and syncs its append-only file before it answers a write
(``appendfsync always``: a killed valkey loses nothing it acknowledged), and JetStream keeps its streams in
files.

With ``--ha`` the servers are replicated (:func:`~coorm.shared.servers.start_replicated_servers`): a
3-server NATS cluster whose streams have 3 replicas, and a Valkey primary with two replicas under three
sentinels; every process gets the three NATS URLs and the sentinels, and carries on when one NATS server
or the Valkey primary dies (docs/ha.md). A dead server is started again as any child is."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.panel import Panel

from coorm.cli.supervise import Backoff, Child, describe, spawn
from coorm.shared.servers import free_port, start_replicated_servers, start_servers
from coorm.shared.settings import Settings, connection_file
from coorm.shared.valkey import describe as where_redis

ENGINES = ("policy-engine", "policy-engine-standby")
STREAM_REPLICAS = 3  # with --ha: a copy of each stream on every server of the NATS cluster


def parse_clusters(text: str) -> dict[str, int]:
    """``c0=16,c1=16`` -> {"c0": 16, "c1": 16}."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, n = part.partition("=")
        if not name or not n.isdigit() or int(n) < 1:
            raise ValueError(f"cannot read {part!r}: write CLUSTER=NODES, e.g. c0=16,c1=16")
        out[name] = int(n)
    if not out:
        raise ValueError("no cluster given")
    return out


class Up:
    """The running embedded system; :meth:`start` returns once every node is up."""

    def __init__(self, clusters: dict[str, int], workdir: Path | None = None, *, env: dict | None = None,
                 log_dir: Path | None = None, accounting: bool | None = None, write_connection: bool = True,
                 ha: bool = False) -> None:
        self.clusters = clusters
        self.ha = ha  # replicated servers (a NATS cluster, Valkey under Sentinel)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="coorm-up-"))
        self.log_dir = log_dir or self.workdir / "logs"
        self.extra_env = env or {}
        if accounting is None:
            import importlib.util

            accounting = importlib.util.find_spec("coorm.services.accounting.service") is not None
        self.accounting = accounting
        self.write_connection = write_connection
        self.servers = None
        self.children: dict[str, Child] = {}
        self.server_names: list[str] = []  # the children that are servers (stopped last)
        self.metrics_ports: dict[str, int] = {}  # process name -> where it serves its Prometheus metrics
        self.settings: Settings | None = None
        self.backoff = Backoff()
        self._users_seen: float | None = None  # (--ha) when nats-auth.conf last changed, as last seen
        self.failed: str | None = None  # why supervision gave up
        self.stop_reason: str | None = None  # set (by a signal handler) to stop; a start under way gives up
        self.say: Callable[[str], None] = lambda line: None  # where restarts are announced (the console)

    @property
    def procs(self) -> dict[str, subprocess.Popen]:
        """Each child's current process."""
        return {name: c.proc for name, c in self.children.items() if c.proc is not None}

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # its agents' state files are this instance's: another coorm up of the same user (same agent ids) must
        # never take them for its predecessors'
        env["COORM_AGENT_STATE_DIR"] = str(self.workdir / "agents")
        env.update(self.extra_env)
        env["COORM_NATS_URL"] = self.servers.nats_url
        env["COORM_REDIS_URL"] = self.servers.redis_url
        # each child finds its role's identity there (the store's directory is the operator's: 0700)
        env["COORM_CREDENTIALS_DIR"] = str(self.servers.credentials)
        env["COORM_STREAM_REPLICAS"] = str(STREAM_REPLICAS if self.ha else 1)
        env.pop("COORM_REDIS_SENTINEL", None)  # (this instance's sentinels, if any, are in the URL)
        env.pop("COORM_NATS_CREDENTIALS", None)
        return env

    def _spawn(self, name: str, args: list[str], *, metrics: bool = True) -> None:
        env = self._env()
        if metrics:
            self.metrics_ports[name] = free_port()  # (the same port after a restart: Prometheus finds it)
            env.update(COORM_METRICS_PORT=str(self.metrics_ports[name]), COORM_METRICS_ADDR="127.0.0.1")
        argv = [sys.executable, "-m", "coorm.cli.main", *args]
        log = self.log_dir / f"{name}.log"
        child = Child(name, start=lambda: spawn(argv, env=env, log=log, cwd=self.workdir))
        self.children[name] = child  # first: a stop, whenever it comes, finds what was started
        self._start(child)
        self._write_pids()  # (at once: a coorm up stopped while starting still says what it started)

    def _start(self, child: Child) -> None:
        child.proc = child.start()
        child.started = time.monotonic()
        child.due = None

    def _adopt_servers(self) -> None:
        """The servers (nats-server and valkey; with ``ha`` each NATS server, Valkey and sentinel) become
        children like the others: the same command (ports, data directory) starts them again."""
        assert self.servers is not None
        self.server_names = list(self.servers.named_procs())
        for name, proc in self.servers.named_procs().items():
            argv = [str(a) for a in proc.args]  # type: ignore[union-attr]
            log = self.log_dir / f"{name}.log"
            self.children[name] = Child(name, start=lambda argv=argv, log=log: spawn(argv, env=dict(os.environ),
                                                                                        log=log),
                                        proc=proc, started=time.monotonic())
        self._write_pids()

    def start(self, timeout: float = 60.0) -> Settings:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.ha:
            self.servers = start_replicated_servers(self.workdir / "servers")
        else:
            self.servers = start_servers(self.workdir / "servers", fsync_always=True)
        self._adopt_servers()
        own = {k.removeprefix("COORM_").lower(): v for k, v in self.extra_env.items() if k.startswith("COORM_")}
        own = {k: v for k, v in own.items()
               if k in Settings.model_fields and k not in ("nats_url", "redis_url", "credentials_dir",
                                                           "redis_sentinel", "stream_replicas")}
        self.settings = Settings(nats_url=self.servers.nats_url, redis_url=self.servers.redis_url,
                                 credentials_dir=self.servers.credentials,
                                 stream_replicas=STREAM_REPLICAS if self.ha else 1, **own)
        for engine in ENGINES:  # the second stands by: it takes over within a lease of the leader's death
            self._spawn(engine, ["service", "policy-engine"])
        services = ["node-allocator", "view-publisher", "batch"]
        if self.accounting:
            services.append("accounting")
        for s in services:
            self._spawn(s, ["service", s])
        if self.accounting:
            self._spawn("celery-worker", ["_celery", "worker"], metrics=False)
        for cluster, n in self.clusters.items():
            span = f"{cluster}n0..{cluster}n{n - 1}"
            self._spawn(f"agent-{cluster}", ["agent", "--cluster", cluster, "--nodes", span, "--cores", "1",
                                             "--memory-mb", "1024", "--id", f"agent-{cluster}"])
        self._wait_nodes(timeout)
        self._reload_users()  # (what the store's users are now: a change from here on is told to every server)
        self._write_pids()
        self.targets_file.write_text(json.dumps(self.prometheus_targets(), indent=1) + "\n")
        if self.write_connection:
            self.settings.write_connection_file()
        return self.settings

    @property
    def pids_file(self) -> Path:
        return self.workdir / "pids.json"

    def _write_pids(self) -> None:
        tmp = self.pids_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({name: c.pid for name, c in self.children.items()}, indent=1) + "\n")
        tmp.replace(self.pids_file)

    def _log(self, line: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with open(self.workdir / "supervisor.log", "a") as f:
            f.write(f"{stamp} {line}\n")
        self.say(line)

    def supervise(self, now: float | None = None) -> bool:
        """One look at the children: a dead one is restarted once its back-off is over. False once a child
        is beyond repair (:attr:`failed` says which and why)."""
        now = time.monotonic() if now is None else now
        self._reload_users()
        changed = False
        for child in self.children.values():
            if child.due is not None:
                if now >= child.due:
                    self._start(child)
                    child.restarts += 1
                    changed = True
                    self._log(f"{child.name} started again (pid {child.pid}, restart {child.restarts})")
                continue
            if child.alive():
                continue
            assert child.proc is not None
            code = child.proc.returncode
            delay = self.backoff.delay(child.deaths, child.started, now, child.last_delay)
            child.deaths.append(now)
            if delay is None:
                self.failed = (f"{child.name} {describe(code)} {len(child.deaths)} times within "
                               f"{self.backoff.window:g} s; see {self.log_dir / child.name}.log")
                self._log(f"giving up: {self.failed}")
                return False
            child.last_delay, child.due = delay, now + delay
            self._log(f"{child.name} {describe(code)}: starting it again in {delay:g} s")
        if changed:
            self._write_pids()
        return True

    def _reload_users(self) -> None:
        """With ``ha``, every NATS server reads its users again when the store's ``nats-auth.conf`` changed
        (``coorm user add``/``remove`` tells only the server of the store's pid file: one of the three)."""
        if not self.ha or self.servers is None:
            return
        from coorm.shared.credentials import CredentialStore

        try:
            mtime = CredentialStore(self.servers.credentials).nats_auth_path.stat().st_mtime
        except OSError:
            return
        if self._users_seen is None:
            self._users_seen = mtime
        elif mtime != self._users_seen:
            self._users_seen = mtime
            for name in self.server_names:
                child = self.children.get(name)
                if name.startswith("nats") and child is not None and child.alive() and child.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGHUP)
            self._log("the store's users changed: every NATS server reads them again")

    @property
    def targets_file(self) -> Path:
        """Prometheus file-based service discovery (``file_sd_configs``) of every process's metrics."""
        return self.workdir / "prometheus-targets.json"

    def prometheus_targets(self) -> list[dict]:
        return [{"targets": [f"127.0.0.1:{port}"], "labels": {"job": name}}
                for name, port in sorted(self.metrics_ports.items())]

    def _wait_nodes(self, timeout: float) -> None:
        """Until the policy engine reports every node up (polling its status: nothing to wait on)."""

        from coorm.cli.live import _status, run

        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.stop_reason is not None:
                raise Interrupted(self.stop_reason)
            for name, c in self.children.items():
                if not c.alive():
                    code = c.proc.returncode if c.proc is not None else None
                    raise RuntimeError(f"{name} exited with code {code}; see {self.log_dir / name}.log")
            try:
                st = run(_status(self.settings, everything=False, within=0))  # (its children are watched)
                up = {c.cluster: c.up for c in st.clusters}
                if all(up.get(c) == n for c, n in self.clusters.items()):
                    return
                last = up
            except Exception as e:  # noqa: BLE001 - not up yet
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"the system did not come up within {timeout:g} s (last seen: {last}); "
                           f"logs in {self.log_dir}")

    def stop(self, reason: str = "coorm up was stopped") -> None:
        """Tell every application why, stop the services, then the agents (they kill their processes), then
        the servers. Services first: none of them sees the agents go (nodes down, requests ended) and tells
        an application another story than ``SystemStopping``."""
        nats = [c for n, c in self.children.items() if n in self.server_names and n.startswith("nats")]
        if self.servers is not None and any(c.alive() for c in nats):
            self._announce(reason)
        servers = [self.children.pop(n) for n in self.server_names if n in self.children]
        agents = [self.children.pop(n) for n in list(self.children) if n.startswith("agent-")]
        for group in (list(self.children.values()), agents, servers):
            _terminate([c.proc for c in group if c.proc is not None])
        self.children.clear()
        if self.servers is not None:
            self.servers.stop()  # (only what was started but never adopted, if a stop came in between)
        if self.write_connection and self.settings is not None:
            path = connection_file()
            try:
                if self.servers.nats_url in path.read_text():
                    path.unlink()
            except OSError:
                pass

    def _announce(self, reason: str) -> None:
        """``SystemStopping`` to every launcher (best effort: a second at most)."""
        import asyncio

        from coorm.shared import bus, subjects
        from coorm.shared.protocol import SystemStopping

        async def send() -> None:
            import nats

            assert self.servers is not None
            from coorm.shared.credentials import CredentialStore
            from coorm.shared.endpoints import Role

            service = CredentialStore(self.servers.credentials).role(Role.SERVICE)
            nc = await nats.connect(self.servers.nats_url.split(","), connect_timeout=1, allow_reconnect=False,
                                    nkeys_seed_str=service.seed, inbox_prefix=service.inbox_prefix)
            try:
                await nc.publish(subjects.SYSTEM_STOPPING, bus.encode(SystemStopping(reason=reason)))
                await bus.settled(nc, 1)
            finally:
                await nc.close()

        with contextlib.suppress(Exception):
            asyncio.run(asyncio.wait_for(send(), 2.0))

    def __enter__(self) -> Up:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Interrupted(RuntimeError):
    """:meth:`Up.start` gave up: it was asked to stop (:attr:`Up.stop_reason`)."""


def _terminate(procs: list[subprocess.Popen], grace: float = 15.0) -> None:
    """TERM each process group, KILL what is left after ``grace``; wait for all."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run(clusters_text: str, workdir: Path | None, ha: bool = False) -> None:
    console = Console()
    clusters = parse_clusters(clusters_text)
    up = Up(clusters, workdir, ha=ha)

    def on_signal(sig, _frame):
        up.stop_reason = up.stop_reason or f"coorm up was stopped ({signal.Signals(sig).name})"

    # from the start: Ctrl-C or SIGTERM while starting stops what has started (children are in sessions of
    # their own: the terminal's Ctrl-C does not reach them, and they would outlive a coorm up killed by it)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with console.status("starting nats-server, valkey-server, the services and the agents..."):
        try:
            up.start()
        except Exception as e:
            up.stop(up.stop_reason or f"coorm up failed: {e}")
            if isinstance(e, Interrupted):
                console.print("stopped.")
                return
            Console(stderr=True).print(f"[red]coorm up failed:[/red] {e}", soft_wrap=True)
            raise SystemExit(1) from None
    s = up.settings
    nodes = ", ".join(f"{c}: {n} nodes" for c, n in clusters.items())
    console.print(Panel.fit(
        f"[bold]CooRM is up[/bold] — {nodes}\n\n"
        f"NATS   {s.nats_url}\nRedis  {where_redis(s.redis_url)}\nlogs   {up.log_dir}\n"
        f"metrics  http://127.0.0.1:{up.metrics_ports['policy-engine']}/metrics (policy engine); every process's "
        f"in {up.targets_file} (Prometheus file_sd)\n\n"
        f"Other [bold]coorm[/bold] commands of this user find it (and their credentials) through "
        f"{connection_file()}; nothing answers without credentials. Let another user in: "
        f"coorm user add NAME\n\n"
        "Try, in another terminal:\n"
        f"  coorm submit -c {next(iter(clusters))} -N 2 -t 5m -- hostname\n"
        "  coorm status; coorm nodes; coorm apps; coorm requests\n"
        f"  coorm estimate -c {next(iter(clusters))} -N 4 -t 1h\n\n"
        "Ctrl-C stops everything.", title="coorm up"))
    up.say = lambda line: console.print(f"[yellow]{line}[/yellow]", soft_wrap=True)  # (one line each, unwrapped)
    try:
        while up.stop_reason is None:
            if not up.supervise():
                up.stop_reason = f"coorm up could not repair itself: {up.failed}"
                break
            time.sleep(0.2)  # supervising the children: a look five times a second
    finally:
        console.print("stopping...")
        up.stop(up.stop_reason or "coorm up stopped")
        console.print("stopped.")
    if up.failed is not None:  # the reason, on one line (not wrapped at the console's width)
        Console(stderr=True).print(f"[red]coorm up could not repair itself:[/red] {up.failed}", soft_wrap=True)
        raise SystemExit(1)
