"""``coorm up``: the embedded default. A local nats-server (JetStream) and valkey-server on free ports,
every service and one agent per cluster as child processes, the connection settings written where every
other ``coorm`` command of this user finds them; in the foreground until Ctrl-C, then everything stops."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.panel import Panel

from coorm.shared.servers import free_port, start_servers
from coorm.shared.settings import Settings, connection_file


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
                 log_dir: Path | None = None, accounting: bool | None = None, write_connection: bool = True) -> None:
        self.clusters = clusters
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="coorm-up-"))
        self.log_dir = log_dir or self.workdir / "logs"
        self.extra_env = env or {}
        if accounting is None:
            import importlib.util

            accounting = importlib.util.find_spec("coorm.services.accounting.service") is not None
        self.accounting = accounting
        self.write_connection = write_connection
        self.servers = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.metrics_ports: dict[str, int] = {}  # process name -> where it serves its Prometheus metrics
        self.settings: Settings | None = None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env["COORM_NATS_URL"] = self.servers.nats_url
        env["COORM_REDIS_URL"] = self.servers.redis_url
        return env

    def _spawn(self, name: str, args: list[str], *, metrics: bool = True) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = self._env()
        if metrics:
            self.metrics_ports[name] = free_port()
            env.update(COORM_METRICS_PORT=str(self.metrics_ports[name]), COORM_METRICS_ADDR="127.0.0.1")
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "coorm.cli.main", *args], env=env,
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, cwd=self.workdir)
        log.close()

    def start(self, timeout: float = 60.0) -> Settings:
        self.servers = start_servers(self.workdir / "servers")
        own = {k.removeprefix("COORM_").lower(): v for k, v in self.extra_env.items() if k.startswith("COORM_")}
        own = {k: v for k, v in own.items() if k in Settings.model_fields and k not in ("nats_url", "redis_url")}
        self.settings = Settings(nats_url=self.servers.nats_url, redis_url=self.servers.redis_url, **own)
        services = ["policy-engine", "node-allocator", "view-publisher"]
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
        self.targets_file.write_text(json.dumps(self.prometheus_targets(), indent=1) + "\n")
        if self.write_connection:
            self.settings.write_connection_file()
        return self.settings

    @property
    def targets_file(self) -> Path:
        """Prometheus file-based service discovery (``file_sd_configs``) of every process's metrics."""
        return self.workdir / "prometheus-targets.json"

    def prometheus_targets(self) -> list[dict]:
        return [{"targets": [f"127.0.0.1:{port}"], "labels": {"job": name}}
                for name, port in sorted(self.metrics_ports.items())]

    def _wait_nodes(self, timeout: float) -> None:
        """Until the policy engine reports every node up (polling its status: nothing to wait on)."""
        import asyncio

        from coorm.cli.live import _status

        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {p.returncode}; see {self.log_dir / name}.log")
            try:
                st = asyncio.run(_status(self.settings))
                up = {c.cluster: c.up for c in st.clusters}
                if all(up.get(c) == n for c, n in self.clusters.items()):
                    return
                last = up
            except Exception as e:  # noqa: BLE001 - not up yet
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"the system did not come up within {timeout:g} s (last seen: {last}); "
                           f"logs in {self.log_dir}")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()
        if self.servers is not None:
            self.servers.stop()
        if self.write_connection and self.settings is not None:
            path = connection_file()
            try:
                if self.servers.nats_url in path.read_text():
                    path.unlink()
            except OSError:
                pass

    def __enter__(self) -> Up:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run(clusters_text: str, workdir: Path | None) -> None:
    console = Console()
    clusters = parse_clusters(clusters_text)
    up = Up(clusters, workdir)
    with console.status("starting nats-server, valkey-server, the services and the agents..."):
        try:
            up.start()
        except Exception as e:
            up.stop()
            console.print(f"[red]coorm up failed:[/red] {e}")
            raise SystemExit(1) from None
    s = up.settings
    nodes = ", ".join(f"{c}: {n} nodes" for c, n in clusters.items())
    console.print(Panel.fit(
        f"[bold]CooRM is up[/bold] — {nodes}\n\n"
        f"NATS   {s.nats_url}\nRedis  {s.redis_url}\nlogs   {up.log_dir}\n"
        f"metrics  http://127.0.0.1:{up.metrics_ports['policy-engine']}/metrics (policy engine); every process's "
        f"in {up.targets_file} (Prometheus file_sd)\n\n"
        f"Other [bold]coorm[/bold] commands of this user find it through {connection_file()}; elsewhere:\n"
        f"  export COORM_NATS_URL={s.nats_url} COORM_REDIS_URL={s.redis_url}\n\n"
        "Try, in another terminal:\n"
        f"  coorm submit -c {next(iter(clusters))} -N 2 -t 5m -- hostname\n"
        "  coorm status; coorm nodes; coorm apps; coorm requests\n"
        f"  coorm estimate -c {next(iter(clusters))} -N 4 -t 1h\n\n"
        "Ctrl-C stops everything.", title="coorm up"))
    stop = {"now": False}

    def on_signal(*_):
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop["now"]:
            for name, p in up.procs.items():
                if p.poll() is not None:
                    console.print(f"[red]{name} exited with code {p.returncode}[/red]; see {up.log_dir / name}.log")
                    stop["now"] = True
                    break
            time.sleep(0.5)  # supervising the children: a check every half second
    finally:
        console.print("stopping...")
        up.stop()
        console.print("stopped.")
