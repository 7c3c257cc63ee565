"""Message sizes encoded the way CooRM §IV-B measured them: like CORBA's CDR (GIOP header, 4-byte
lengths, strings with their NUL, doubles aligned on 8). Only sizes are computed: nothing is encoded."""

from __future__ import annotations

from coorm.shared.requests import RequestSpec

HEADER = 12 + 24  # GIOP header + a request header with an object key and operation name


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def string(s: str) -> int:
    return _align(4 + len(s) + 1, 4)


def cap(steps: int) -> int:
    """A CAP: a sequence of (double time, long nodes), 16 bytes per step with alignment."""
    return 8 + 16 * steps


def change_notify(changes: list[tuple[str, int]]) -> int:
    """``changes``: (cluster id, number of steps) per CHANGE."""
    return HEADER + 4 + sum(string(c) + 4 + cap(n) for c, n in changes)


def where(spec: RequestSpec) -> str:
    """What stands for a request's cluster id: the id, or the placement rule and the clusters it allows (the
    RMS chooses among them)."""
    return spec.cluster or ",".join([spec.placement or "", *(spec.clusters or ())])


def request(app: str, requests: list[tuple[str, str, str | None]]) -> int:
    """``requests``: (request id, cluster id, related_to) each; type, nodes, duration, how are fixed."""
    body = sum(string(rid) + string(c) + 4 + 4 + 8 + 4 + string(rel or "") for rid, c, rel in requests)
    return HEADER + string(app) + 4 + _align(body, 8)


def done(app: str, request_id: str, released: int, node_id_len: int = 8) -> int:
    return HEADER + string(app) + string(request_id) + 4 + released * string("x" * node_id_len)


def start_notify(request_id: str, nodes: list[str]) -> int:
    return HEADER + string(request_id) + 4 + sum(string(n) for n in nodes)


def subscribe(app: str) -> int:
    return HEADER + string(app) + 32


def close(app: str) -> int:
    return HEADER + string(app)


def info_query() -> int:
    """``listClustersInfo`` / ``listInterClusterInfo``: a request without arguments."""
    return HEADER


def clusters_info(clusters: list[str]) -> int:
    """CINFO's reply: per cluster its id, nodes, cores and memory per node (longs) and its speed (a double)."""
    return HEADER + _align(4 + sum(_align(string(c) + 12, 8) + 8 for c in clusters), 8)


def inter_cluster_info(clusters: list[str]) -> int:
    """ICINFO's reply: per pair of clusters (once each, as the live view publisher answers) both ids, the
    latency and the bandwidth (doubles)."""
    pairs = [(a, b) for i, a in enumerate(clusters) for b in clusters[i + 1:]]
    return HEADER + _align(4 + sum(_align(string(a) + string(b), 8) + 16 for a, b in pairs), 8)


def cluster_queries(clusters: list[str]) -> list[int]:
    """What a launcher exchanges when it starts, message by message: both queries and their replies (CooRM
    Fig. 4, steps 3 and 4: "the launcher has no previous knowledge about the clusters", it pulls the CINFOs
    and the ICINFO before its first request; the live SDK's ``cluster_props`` does the same)."""
    return [info_query(), clusters_info(clusters), info_query(), inter_cluster_info(clusters)]
