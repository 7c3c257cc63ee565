"""The compose stack's Prometheus and Grafana configuration: promtool accepts the scrape configuration and its
jobs cover every CooRM container that serves metrics; Grafana's provisioning parses, its datasource is the
one the dashboards name, and its dashboard provider reads the folder compose mounts from ``dashboards/``."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.stackfiles import (
    GRAFANA_PROVISIONING,
    PROMETHEUS_YML,
    ROOT,
    compose,
    environment,
    is_coorm,
    mounts,
)
from tests.programs import program


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    return compose()["services"]


def _promtool(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([program("promtool"), "check", "config", str(config)], capture_output=True, text=True,
                          timeout=60)


# ================================================================================================
# Prometheus
# ================================================================================================
def test_promtool_accepts_the_scrape_configuration():
    check = _promtool(PROMETHEUS_YML)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout + check.stderr


def test_promtool_refuses_a_broken_configuration(tmp_path):
    """The check above can fail: a scrape job without a name is refused."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    del config["scrape_configs"][0]["job_name"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    assert _promtool(tmp_path / "prometheus.yml").returncode != 0


def test_the_example_of_agents_on_real_hosts_is_a_valid_discovery_file(tmp_path, services):
    """``deploy/prometheus/agents/hosts.yml.example``, copied to ``hosts.yml`` in the folder the file-based
    discovery reads (the mount of the prometheus service), passes promtool's check of that file."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    (sd,) = [c for c in config["scrape_configs"] if "file_sd_configs" in c]
    (pattern,) = sd["file_sd_configs"][0]["files"]
    folder = str(Path(pattern).parent)
    mount = next(m for m in mounts(services["prometheus"]) if m.target == folder)
    agents = tmp_path / "agents"
    agents.mkdir()
    shutil.copy(ROOT / mount.source / "hosts.yml.example", agents / "hosts.yml")
    sd["file_sd_configs"][0]["files"] = [str(agents / Path(pattern).name)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    check = _promtool(tmp_path / "prometheus.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    (agents / "hosts.yml").write_text("- targets: oops\n")  # and a broken one fails
    assert _promtool(tmp_path / "prometheus.yml").returncode != 0


def test_every_container_that_serves_metrics_is_scraped(services):
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    jobs = {c["job_name"]: [t for sc in c.get("static_configs", []) for t in sc["targets"]]
            for c in config["scrape_configs"]}
    exporters = {name: environment(s)["COORM_METRICS_PORT"] for name, s in services.items()
                 if is_coorm(s) and "COORM_METRICS_PORT" in environment(s)}
    assert {"policy-engine", "view-publisher", "node-allocator", "accounting"} <= set(exporters)
    assert sum(1 for name in exporters if name.startswith("agent")) >= 2
    for name, port in exporters.items():
        assert jobs.get(name) == [f"{name}:{port}"], f"no scrape job {name} for {name}:{port}"
    # and nothing is scraped that the stack does not run
    for job, targets in jobs.items():
        for target in targets:
            host = target.rsplit(":", 1)[0]
            assert host == "localhost" or host in services, f"job {job} scrapes {target}: no such service"
    # the Celery processes export nothing, and are not scraped
    for name, s in services.items():
        if is_coorm(s) and name not in exporters:
            assert name not in jobs, name


def test_prometheus_reads_the_files_it_is_given(services):
    prom = services["prometheus"]
    targets = {m.target: m.source for m in mounts(prom) if m.bind}
    config_flag = next(a for a in prom["command"] if a.startswith("--config.file="))
    config_path = config_flag.split("=", 1)[1]
    assert (ROOT / targets[config_path]).resolve() == PROMETHEUS_YML.resolve()


# ================================================================================================
# Grafana
# ================================================================================================
def _provisioning(kind: str) -> list[dict]:
    files = sorted((GRAFANA_PROVISIONING / kind).glob("*.y*ml"))
    assert files, f"no {kind} provisioning"
    return [yaml.safe_load(f.read_text()) for f in files]


def _grafana_mount(services, source: str) -> str:
    """Where compose mounts the repository's ``source`` into the grafana container."""
    for m in mounts(services["grafana"]):
        if m.bind and (ROOT / m.source).resolve() == (ROOT / source).resolve():
            return m.target
    raise AssertionError(f"grafana does not mount {source}")


def test_grafana_reads_the_provisioning_folder(services):
    assert _grafana_mount(services, "deploy/grafana/provisioning") == "/etc/grafana/provisioning"


def test_the_datasource_is_the_compose_prometheus_with_the_dashboards_uid(services):
    (doc,) = _provisioning("datasources")
    assert doc["apiVersion"] == 1
    (ds,) = [d for d in doc["datasources"] if d["type"] == "prometheus"]
    assert ds["uid"] == "prometheus" and ds["access"] == "proxy"
    host, port = ds["url"].removeprefix("http://").rstrip("/").split(":")
    assert host in services and host == "prometheus"
    published = [p for p in services["prometheus"].get("ports", [])]
    assert any(str(p).endswith(f":{port}") for p in published), f"prometheus does not listen on {port}"


def test_the_dashboard_provider_reads_the_mounted_dashboards(services):
    (doc,) = _provisioning("dashboards")
    (provider,) = doc["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == _grafana_mount(services, "dashboards")


def test_the_dashboards_use_the_provisioned_datasource():
    (doc,) = _provisioning("datasources")
    uids = {d["uid"] for d in doc["datasources"]}
    dashboards = sorted((ROOT / "dashboards").glob("*.json"))
    assert dashboards, "no dashboard in dashboards/"

    def refs(node):
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and ds.get("type") == "prometheus":
                yield ds.get("uid")
            for v in node.values():
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)

    for path in dashboards:
        used = set(refs(json.loads(path.read_text())))
        assert used and used <= uids, f"{path.name} refers to datasources {used - uids or 'none'}"
