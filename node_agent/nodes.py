"""Which nodes an agent serves: node-list syntax (``n0..n15``, ``a,b,c``, ``c0n0..c0n3``) and what a node
has (cores, memory), read from the host unless given."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from coorm.shared.protocol import NodeInfo

# a node ID is a NATS subject token: no dots, no wildcards, no spaces
_NODE = re.compile(r"^[A-Za-z0-9_:@-]{1,128}$")
_RANGE = re.compile(r"^(?P<prefix>(?:.*\D)?)(?P<first>\d+)\.\.(?P<prefix2>(?:.*\D)?)(?P<last>\d+)$")


def parse_nodes(spec: str) -> list[str]:
    """``"n0..n15"`` -> ``["n0", ..., "n15"]``; ``"a,b,c"``; items of a comma list may be ranges
    (``"c0n0..c0n3,c1n0..c1n3"``); ``"n0..15"`` is ``"n0..n15"``; a zero-padded start keeps its width
    (``"n00..n11"`` -> ``n00 ... n11``). Raises ``ValueError`` on anything else, or on a duplicate."""
    out: list[str] = []
    seen: set[str] = set()
    items = [item.strip() for item in spec.split(",")]
    if not any(items):
        raise ValueError("no nodes given")
    for item in items:
        if not item:
            raise ValueError(f"empty item in node list {spec!r}")
        names = _expand(item)
        for name in names:
            if not _NODE.match(name):
                raise ValueError(f"invalid node name {name!r}: letters, digits, '_', ':', '@', '-' only")
            if name in seen:
                raise ValueError(f"node {name!r} given twice")
            seen.add(name)
            out.append(name)
    return out


def _expand(item: str) -> list[str]:
    if ".." not in item:
        return [item]
    m = _RANGE.match(item)
    if m is None:
        raise ValueError(f"invalid node range {item!r}: expected PREFIX<a>..PREFIX<b>, e.g. n0..n15")
    prefix, prefix2 = m["prefix"], m["prefix2"]
    if prefix2 and prefix2 != prefix:
        raise ValueError(f"invalid node range {item!r}: both ends must have the same prefix")
    first, last = int(m["first"]), int(m["last"])
    if last < first:
        raise ValueError(f"invalid node range {item!r}: {last} < {first}")
    if last - first >= 100_000:
        raise ValueError(f"node range {item!r} is too large")
    width = len(m["first"]) if m["first"].startswith("0") and len(m["first"]) > 1 else 0
    return [f"{prefix}{i:0{width}d}" if width else f"{prefix}{i}" for i in range(first, last + 1)]


def host_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Total memory of the host in MiB (``MemTotal`` of /proc/meminfo, else sysconf)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                parts = line.split()
                kib = int(parts[1])
                return max(1, kib // 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return max(1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024))
    except (ValueError, OSError, AttributeError):
        return 1


def host_node_info(nodes: list[str], *, cores: int | None = None, memory_mb: int | None = None) -> list[NodeInfo]:
    """One :class:`NodeInfo` per node ID, each with ``cores`` (default: the host's CPU count) and
    ``memory_mb`` (default: the host's total memory). Emulated nodes each report the whole host."""
    c = cores if cores is not None else (os.cpu_count() or 1)
    m = memory_mb if memory_mb is not None else host_memory_mb()
    return [NodeInfo(id=n, cores=c, memory_mb=m) for n in nodes]


def default_agent_id(cluster: str) -> str:
    """``<cluster>@<hostname>``, made a valid identifier."""
    host = re.sub(r"[^A-Za-z0-9_.:@-]", "-", socket.gethostname()) or "host"
    return f"{cluster}@{host}"[:128]
