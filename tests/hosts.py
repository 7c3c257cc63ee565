"""Hosts for tests: network namespaces joined by veth pairs to a bridge, on a 10.x subnet the test makes
and removes, so that node agents run on "hosts" of their own whose link a test can cut and heal
(``ip link set ... down``). With ``links=2`` each host has a second link, on a bridge and subnet of its own:
cutting the first leaves the second up -- a partial partition (a host's servers cut from each other, still
reached by clients over the other network). Needs root (CAP_NET_ADMIN) and ``ip``; :func:`unavailable` says why not.

Every name carries a random tag (several test runs may share the machine); everything made is removed on
exit, whatever happened."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=10)


def unavailable() -> str | None:
    """Why hosts cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "no ip command"
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_NET_ADMIN"
    probe = f"coorm-probe-{secrets.token_hex(3)}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Hosts:
    """``with Hosts(["h1", "h2"]) as hosts:``; ``hosts.gateway`` is the bridge's address (where servers
    listen for them), ``hosts.addr[name]`` a host's; on the second link (``links=2``), ``hosts.gateways[1]``
    and ``hosts.addrs[name][1]``."""

    names: list[str]
    links: int = 1
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    gateway: str = ""
    addr: dict[str, str] = field(default_factory=dict)
    gateways: list[str] = field(default_factory=list)
    addrs: dict[str, list[str]] = field(default_factory=dict)
    _made: list[tuple[str, str]] = field(default_factory=list)  # (kind, name), undone in reverse

    def __enter__(self) -> Hosts:
        first = secrets.randbelow(250 - self.links)
        nets = [f"10.{200 + secrets.randbelow(50)}.{first + k}" for k in range(self.links)]
        self.gateways = [f"{net}.1" for net in nets]
        self.gateway = self.gateways[0]
        try:
            for k, gateway in enumerate(self.gateways):
                bridge = f"cb{self.tag}{_nth(k)}"
                _ip("link", "add", bridge, "type", "bridge")
                self._made.append(("link", bridge))
                _ip("addr", "add", f"{gateway}/24", "dev", bridge)
                _ip("link", "set", bridge, "up")
            for i, name in enumerate(self.names):
                ns = self.netns(name)
                _ip("netns", "add", ns)
                self._made.append(("netns", ns))
                _ip("link", "set", "lo", "up", ns=ns)
                self.addrs[name] = []
                for k, net in enumerate(nets):
                    outer, inner = self.link(name, k), f"ci{self.tag}{i}{_nth(k)}"
                    _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                    self._made.append(("link", outer))
                    _ip("link", "set", inner, "netns", ns)
                    _ip("link", "set", outer, "master", f"cb{self.tag}{_nth(k)}")
                    _ip("link", "set", outer, "up")
                    self.addrs[name].append(f"{net}.{10 + i}")
                    _ip("addr", "add", f"{self.addrs[name][k]}/24", "dev", inner, ns=ns)
                    _ip("link", "set", inner, "up", ns=ns)
                self.addr[name] = self.addrs[name][0]
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for kind, name in reversed(self._made):
            if kind == "netns":
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            else:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        self._made.clear()

    def netns(self, name: str) -> str:
        return f"coorm-{self.tag}-{name}"

    def link(self, name: str, k: int = 0) -> str:
        """The host's end of its ``k``-th link on the bridge's side (what a cut takes down)."""
        return f"co{self.tag}{self.names.index(name)}{_nth(k)}"

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run on host ``name`` (its network namespace)."""
        return ["ip", "netns", "exec", self.netns(name), *argv]

    def cut(self, name: str, k: int = 0) -> None:
        """The host's ``k``-th link goes down: nothing reaches it or leaves it that way (no reset: its
        connections over it hang)."""
        _ip("link", "set", self.link(name, k), "down")

    def heal(self, name: str, k: int = 0) -> None:
        _ip("link", "set", self.link(name, k), "up")


def _nth(k: int) -> str:
    """A link's suffix in interface names: none for the first (the names of one link as before), then x1..."""
    return f"x{k}" if k else ""


def stop(proc: subprocess.Popen) -> None:
    """End a process a test started in a session of its own (an agent on a host), and whatever it started:
    SIGTERM to its group (an agent kills its launches first), SIGKILL if it is not gone within 10 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
