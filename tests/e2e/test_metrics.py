"""Metrics live in ``coorm up``, and the dashboards' queries resolve against them: every process's endpoint
is scraped as a user's Prometheus would, then a real Prometheus (Debian's package) scrapes the running
system and every panel's query must evaluate to data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coorm.cli.dashboards import load_dashboards, metric_names, panel_queries, render_query
from coorm.shared import metrics
from coorm.shared.servers import free_port
from tests.e2e.processes import interrupt, wait_for
from tests.programs import program

COORM = [sys.executable, "-m", "coorm.cli.main"]
DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - a local test server
        return r.read().decode()


def _defined() -> dict[str, str]:
    """Every metric shared/metrics.py defines: its sample name -> its type."""
    return {obj._name: obj._type for obj in metrics.defined()}


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    """``coorm up`` with two clusters, and a workload that leaves something in every state: a job running,
    one waiting behind it, one killed at its walltime, a PSA growing and shrinking."""
    tmp = tmp_path_factory.mktemp("metrics")
    conn, work = tmp / "connection.json", tmp / "work"
    env = dict(os.environ, COORM_CONNECTION_FILE=str(conn), COORM_RESCHEDULE_INTERVAL="0.05",
               COORM_FAIR_START="0", COORM_KILL_GRACE="0.5")
    env.pop("COORM_NATS_URL", None)
    env.pop("COORM_REDIS_URL", None)
    with open(tmp / "up.log", "wb") as out:
        up = subprocess.Popen([*COORM, "up", "--clusters", "c0=4,c1=4", "--workdir", str(work)], env=env,
                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    user = dict(env)
    procs: list[subprocess.Popen] = []
    try:
        wait_for(lambda: conn.exists() or up.poll() is not None, 90, "coorm up to write its connection file")
        if up.poll() is not None:
            pytest.fail(f"coorm up exited: {(tmp / 'up.log').read_text()}")
        targets = json.loads((work / "prometheus-targets.json").read_text())
        walltime = subprocess.run([*COORM, "submit", "-c", "c1", "-N", "1", "-t", "1s", "--", "sleep", "60"],
                                  env=user, capture_output=True, text=True, timeout=60)
        assert walltime.returncode == 124, walltime.stderr
        subprocess.run([*COORM, "submit", "-c", "c1", "-N", "1", "-t", "5m", "--", "true"], env=user, check=True,
                       capture_output=True, timeout=60)

        def background(*args):
            procs.append(subprocess.Popen([*COORM, *args], env=user, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, cwd=tmp, start_new_session=True))

        background("submit", "-c", "c0", "-N", "4", "-t", "10m", "--", "sleep", "600")
        wait_for(lambda: _requests(user, "started", "c0"), 30, "the first c0 job to start")
        background("submit", "-c", "c0", "-N", "2", "-t", "10m", "--", "sleep", "1")
        wait_for(lambda: _requests(user, "waiting", "c0"), 30, "a c0 job to wait behind it")
        background("launch", "psa", "-c", "c1", "--set", "task_duration=2", "--", "true")
        # what is exported asynchronously: the policy engine's gauges (refreshed every second) and
        # accounting's counters (from the lifecycle stream) catch up with what the commands saw
        port = {t["labels"]["job"]: t["targets"][0] for t in targets}
        wait_for(lambda: 'coorm_waiting_estimated_start_seconds{cluster="c0"'
                 in _get(f"http://{port[_leader(targets)]}/metrics"), 30, "the waiting job's estimate in the metrics")
        wait_for(lambda: "coorm_usage_node_seconds_total{" in _get(f"http://{port['accounting']}/metrics"), 30,
                 "accounting to count the ended jobs")
        yield {"targets": targets, "work": work, "tmp": tmp}
    finally:
        for p in [*procs, up]:
            interrupt(p)


def _leader(targets) -> str:
    """Which of coorm up's two policy engines leads (only the leader exports the policy's gauges)."""
    for t in targets:
        if t["labels"]["job"].startswith("policy-engine") and \
                "coorm_policy_leader 1.0" in _get(f"http://{t['targets'][0]}/metrics"):
            return t["labels"]["job"]
    raise AssertionError("no policy engine leads")


def _requests(env, state: str, cluster: str) -> bool:
    out = subprocess.run([*COORM, "requests", "--json"], env=env, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return False
    return any(r["state"] == state and r["cluster"] == cluster for r in json.loads(out.stdout))


def _scrape(targets) -> dict[str, dict[str, list]]:
    """job -> sample name -> samples, from every process's /metrics."""
    out = {}
    for t in targets:
        text = _get(f"http://{t['targets'][0]}/metrics")
        samples: dict[str, list] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append(s)
        out[t["labels"]["job"]] = samples
    return out


def test_every_process_of_coorm_up_serves_metrics(system):
    jobs = {t["labels"]["job"] for t in system["targets"]}
    assert {"policy-engine", "view-publisher", "node-allocator", "accounting", "agent-c0", "agent-c1"} <= jobs
    scraped = _scrape(system["targets"])
    for job, samples in scraped.items():
        assert "process_cpu_seconds_total" in samples, job


def test_every_defined_metric_is_exported_by_some_process_with_values(system):
    exported: set[str] = set()
    for samples in _scrape(system["targets"]).values():
        exported |= {name for name, ss in samples.items() if ss}
    missing = []
    for name, typ in _defined().items():
        sample = {"counter": f"{name}_total", "histogram": f"{name}_count"}.get(typ, name)
        if sample not in exported:
            missing.append(sample)
    assert not missing, f"defined in shared/metrics.py but exported by no process of coorm up: {missing}"


def test_the_cluster_gauges_partition_the_up_nodes(system):
    pe = _scrape(system["targets"])[_leader(system["targets"])]
    by = {(s.labels["cluster"], s.labels["state"]): s.value for s in pe["coorm_cluster_nodes"]}
    for cluster in ("c0", "c1"):
        assert by[(cluster, "up")] == 4
        parts = sum(v for (c, state), v in by.items() if c == cluster and state != "up")
        assert parts == 4, by
    assert by[("c0", "non_preemptible")] == 4  # the 4-node job holds c0


def test_every_dashboard_query_refers_only_to_exported_metrics(system):
    exported: set[str] = {"up"}  # Prometheus's own, per target
    for samples in _scrape(system["targets"]).values():
        exported |= set(samples)
    dashboards = load_dashboards(DASHBOARDS)
    assert len(dashboards) >= 5
    unknown = {}
    for d in dashboards:
        for q in panel_queries(d):
            names = metric_names(render_query(q))
            assert names, f"{d['title']}: no metric in {q!r}"
            if names - exported:
                unknown[q] = sorted(names - exported)
    assert not unknown, f"queries on metrics that coorm up does not export: {unknown}"


def test_every_dashboard_query_evaluates_to_data_in_a_real_prometheus(system, tmp_path):
    prometheus = program("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: coorm\n    file_sd_configs:\n"
        f"      - files: [{json.dumps(str(system['work'] / 'prometheus-targets.json'))}]\n")
    with open(tmp_path / "prometheus.log", "wb") as log:
        prom = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api/v1"

    def query(expr: str) -> list:
        body = json.loads(_get(f"{api}/query?{urllib.parse.urlencode({'query': expr})}"))
        assert body["status"] == "success", body
        return body["data"]["result"]

    try:
        n = len(system["targets"])
        wait_for(lambda: len(query("up == 1")) == n, 60, f"Prometheus to scrape all {n} targets",
                 errors=(OSError, ValueError))
        queries = {q for d in load_dashboards(DASHBOARDS) for q in panel_queries(d)}
        empty: set[str] = set(queries)

        def all_have_data() -> bool:
            for q in list(empty):
                if query(render_query(q)):
                    empty.discard(q)
            return not empty

        try:
            wait_for(all_have_data, 90, "every dashboard query to return data")
        except TimeoutError:
            pytest.fail(f"{len(empty)} of {len(queries)} dashboard queries return no data: {sorted(empty)}")
    finally:
        prom.terminate()
        try:
            prom.wait(15)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
