"""``docker compose up`` would bring the whole system up, as far as that can be checked without a Docker
engine: the compose file validates against the compose specification, every CooRM container runs a real
``coorm`` command with settings CooRM knows, every variable is documented in ``.env.example``, every
service has a health check and a restart policy, what is mounted exists, and the Dockerfile builds an
image whose entry point is ``coorm``. And the credentials: with the lines ``coorm user env`` prints from a
store ``coorm user init`` made, each container is the identity of its role (services and agents) and the
agents check the services' key; only the nats container sees the store (its users file), Valkey has the
ACL of the credential module (run here, with the local valkey-server), and only the services and Celery
get its password."""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import redis
import typer
from pydantic import TypeAdapter
from typer.testing import CliRunner

from coorm.cli.live import SERVICES
from coorm.cli.main import app
from coorm.node_agent.nodes import parse_nodes
from coorm.shared.credentials import CredentialStore, valkey_acl
from coorm.shared.endpoints import Role
from coorm.shared.servers import _wait_port, free_port, valkey_binary
from coorm.shared.settings import Settings
from tests.deploy.natsserver import CONF, include_of
from tests.deploy.stackfiles import (
    COMPOSE,
    COMPOSE_SCHEMA,
    DOCKERIGNORE,
    ROOT,
    TEST_SECRETS,
    InterpolationError,
    Mount,
    command,
    compose,
    defaults,
    dockerfile,
    env_example,
    environment,
    interpolate,
    is_coorm,
    mounts,
    raw_compose,
    required,
    variables,
)

FIELDS = {f"COORM_{name.upper()}": name for name in Settings.model_fields}
DEPLOYED = ("shared", "services", "launchers", "node_agent", "coorm/cli")  # what the containers run


def _read_by_code() -> set[str]:
    """``COORM_*`` variables the code reads from the environment itself (besides :class:`Settings`)."""
    found = set()
    for pkg in DEPLOYED:
        for path in (ROOT / pkg).rglob("*.py"):
            found |= set(re.findall(r"""(?:environ\.get\(|environ\[|getenv\()\s*["'](COORM_[A-Z0-9_]+)["']""",
                                    path.read_text()))
    return found


EXTRAS = _read_by_code()
# the command line's usage errors (typer carries its own copy of click: take its class from typer's own)
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


@pytest.fixture(scope="module")
def stack() -> dict:
    return compose()


@pytest.fixture(scope="module")
def services(stack) -> dict[str, dict]:
    return stack["services"]


def _coorm_services(services) -> dict[str, dict]:
    return {name: s for name, s in services.items() if is_coorm(s)}


# ================================================================================================
# the compose specification
# ================================================================================================
def _validator():
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_the_compose_file_validates_against_the_compose_specification(stack):
    errors = sorted(_validator().iter_errors(stack), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:10])


@pytest.mark.parametrize("breakage", ["unknown service key", "restart as a list", "healthcheck without test",
                                      "bad depends_on condition"])
def test_the_specification_check_catches_mistakes(stack, breakage):
    """The schema is not vacuous: the same file with one mistake fails."""
    broken = copy.deepcopy(stack)
    svc = broken["services"]["policy-engine"]
    if breakage == "unknown service key":
        svc["restart_policy"] = "always"
    elif breakage == "restart as a list":
        svc["restart"] = ["always"]
    elif breakage == "healthcheck without test":
        svc["healthcheck"] = {"interval": 5}  # an interval is a duration string
    else:
        svc["depends_on"]["nats"]["condition"] = "service_ready"
    assert list(_validator().iter_errors(broken))


def test_the_secrets_must_be_set():
    """``.env.example`` gives no secret a value (the credentials are commented out: ``coorm user env``
    appends them), and compose refuses to run without any one of them."""
    assert required(COMPOSE.read_text()) == set(TEST_SECRETS)
    example = env_example()
    for secret in TEST_SECRETS:
        assert secret in example.documented and not example.values.get(secret), secret
        with pytest.raises(InterpolationError, match=secret):
            interpolate(raw_compose(), {**example.values, **{k: "x" for k in TEST_SECRETS if k != secret}})


# ================================================================================================
# what runs
# ================================================================================================
def test_the_stack_has_every_part(services):
    coorm = _coorm_services(services)
    assert {"nats", "redis", "prometheus", "grafana"} <= set(services) - set(coorm)
    kinds: dict[str, list[str]] = {}
    for name, s in coorm.items():
        cmd = command(s)
        kinds.setdefault(" ".join(cmd[:2]) if cmd[0] in ("service", "celery") else cmd[0], []).append(name)
    for svc in SERVICES:
        assert kinds.get(f"service {svc}"), f"no container runs coorm service {svc}"
    assert kinds.get("celery worker") and len(kinds.get("celery beat", [])) == 1
    assert len(kinds.get("agent", [])) >= 2
    clusters = {_parse(command(coorm[a])).params["cluster"] for a in kinds["agent"]}
    assert len(clusters) >= 2, "the agents should emulate nodes of two clusters"


def _parse(args: list[str]):
    """``coorm ARGS`` parsed by the real command line (the sub-command chain resolved, options and their types
    checked; a usage error raised), without running anything. Returns the command's context."""
    cmd = typer.main.get_command(app)
    name, parent = "coorm", None
    while hasattr(cmd, "resolve_command"):  # a group: the next word is a sub-command
        parent = cmd.context_class(cmd, info_name=name, parent=parent)
        name, sub, args = cmd.resolve_command(parent, list(args))
        assert sub is not None, f"no coorm command {name!r}"
        cmd = sub
    return cmd.make_context(name, list(args), parent=parent)


def test_every_coorm_container_runs_a_real_coorm_command(services):
    entrypoint = [i for i in dockerfile() if i.keyword == "ENTRYPOINT"][-1].json_or_words()
    assert entrypoint == ["coorm"]
    agents: dict[str, str] = {}
    nodes: dict[str, str] = {}
    for name, s in _coorm_services(services).items():
        assert "entrypoint" not in s, f"{name}: the image's entry point is coorm"
        ctx = _parse(command(s))
        verb = ctx.command.name
        if verb == "service":
            assert ctx.params["name"] in SERVICES, f"{name}: coorm service {ctx.params['name']} does not exist"
        elif verb == "agent":
            agent_id = ctx.params["agent_id"]
            assert agent_id and agent_id not in agents, f"{name}: agents need distinct --id"
            agents[agent_id] = name
            for node in parse_nodes(ctx.params["nodes"]):
                assert node not in nodes, f"{node} served by both {nodes[node]} and {name}"
                nodes[node] = name
        else:
            assert verb == "celery" and ctx.args[0] in ("worker", "beat"), f"{name}: {command(s)}"


@pytest.mark.parametrize("args", [["service"], ["agent", "--cluster", "c0"], ["agent", "--cluster", "c0", "--nodes",
                                  "n0..n3", "--cores", "four"], ["services", "policy-engine"]])
def test_the_command_check_refuses_wrong_commands(args):
    with pytest.raises((UsageError, AssertionError)):
        _parse(args)


def test_the_celery_commands_compose_runs(monkeypatch):
    """``coorm celery worker`` / ``beat`` (and the hidden ``_celery`` that ``coorm up`` runs) reach celery with
    the arguments given; only a worker gets the solo pool."""
    from coorm.services.accounting.tasks import celery_app

    seen = []
    monkeypatch.setattr(celery_app, "start", lambda argv: seen.append(list(argv)) or 0)
    runner = CliRunner()
    for args in (["celery", "beat", "--schedule", "/tmp/s"], ["celery", "worker"], ["_celery", "worker"],
                 ["celery", "inspect", "ping"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    assert seen[0] == ["beat", "--schedule", "/tmp/s"]
    assert seen[1] == seen[2] == ["worker", "--pool=solo", "--loglevel=WARNING"]
    assert seen[3] == ["inspect", "ping"]
    assert "celery" in runner.invoke(app, ["--help"]).output


# ================================================================================================
# configuration
# ================================================================================================
def _settings_of(env: dict[str, str], monkeypatch) -> Settings:
    """The settings a CooRM process in a container with this environment reads (the test's own environment
    and connection file left out)."""
    for k in list(FIELDS) + list(EXTRAS):
        if k != "COORM_CONNECTION_FILE":
            monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Settings()  # every value valid for its field


def test_coorm_containers_set_only_settings_coorm_knows(services, monkeypatch, tmp_path):
    monkeypatch.setenv("COORM_CONNECTION_FILE", str(tmp_path / "none.json"))
    for name, s in _coorm_services(services).items():
        env = environment(s)
        unknown = {k for k in env if k not in FIELDS and k not in EXTRAS}
        assert not unknown, f"{name} sets variables CooRM does not read: {unknown}"
        _settings_of(env, monkeypatch)


# ================================================================================================
# credentials: a store made by `coorm user init`, the lines `coorm user env` prints in .env
# ================================================================================================
def _coorm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coorm.cli.main", *args], capture_output=True, text=True,
                          timeout=60, check=True)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory) -> tuple[CredentialStore, dict[str, str], dict[str, dict]]:
    """The store, the .env lines, and the services as compose would run them with those in .env."""
    store_dir = tmp_path_factory.mktemp("deploy") / "credentials"
    _coorm("user", "init", "--store", str(store_dir), "--user", "alice")
    printed = _coorm("user", "env", "--store", str(store_dir)).stdout
    lines = dict(line.split("=", 1) for line in printed.splitlines())
    env = {**env_example().values, **lines, "GRAFANA_ADMIN_PASSWORD": "gr4fana"}
    return CredentialStore(store_dir), lines, compose(env)["services"]


def test_coorm_user_env_prints_the_credentials_compose_requires(deployed):
    _, lines, _ = deployed
    assert set(lines) == required(COMPOSE.read_text()) - {"GRAFANA_ADMIN_PASSWORD"}
    assert all(lines.values()), lines


def test_each_container_is_its_role_s_identity(deployed, monkeypatch, tmp_path):
    """Services as the services' identity, agents as the agents' (and checking the services' key); the
    Celery processes need no NATS. No password in a URL: NATS checks the nkey's signature."""
    store, _, services = deployed
    monkeypatch.setenv("COORM_CONNECTION_FILE", str(tmp_path / "none.json"))
    roles = {"service": Role.SERVICE, "agent": Role.AGENT}
    seen = set()
    for name, s in _coorm_services(services).items():
        verb = command(s)[0]
        env = environment(s)
        assert not {"COORM_NATS_CREDENTIALS", "COORM_CREDENTIALS_DIR"} & set(env), f"{name}: no store in containers"
        if verb == "celery":
            assert not {k for k in env if k.startswith("COORM_NATS_")} and "COORM_SERVICE_KEY" not in env, name
            continue
        assert env["COORM_NATS_URL"] == "nats://nats:4222", name
        settings = _settings_of(env, monkeypatch)
        ident = settings.identity(roles[verb])
        assert ident is not None and ident.role is roles[verb], name
        assert ident.public_key == store.role(roles[verb]).public_key, name
        if verb == "agent":
            assert settings.service_public_key() == store.service_key() == store.role(Role.SERVICE).public_key
        else:
            assert "COORM_SERVICE_KEY" not in env, name
        seen.add(verb)
    assert seen == {"service", "agent"}


def test_only_the_services_and_celery_get_the_valkey_password(deployed, monkeypatch, tmp_path):
    store, _, services = deployed
    monkeypatch.setenv("COORM_CONNECTION_FILE", str(tmp_path / "none.json"))
    for name, s in _coorm_services(services).items():
        env = environment(s)
        if command(s)[0] == "agent":
            assert "COORM_REDIS_URL" not in env, f"{name}: agents need no Redis, so they get no password"
            continue
        url = urlsplit(_settings_of(env, monkeypatch).redis_url)
        assert (url.hostname, url.port, url.username, url.password) == (
            "redis", 6379, "coorm", store.valkey_password()), name


# ================================================================================================
# the nats container reads the store's users
# ================================================================================================
def _store_mount(services) -> Mount:
    (mount,) = [m for m in mounts(services["nats"]) if m.source.rstrip("/").endswith("deploy/credentials")]
    return mount


def test_nats_reads_the_users_of_the_store(services):
    """nats.conf (mounted where the command reads it) includes the users file at the place the store's folder
    is mounted; compose does not create the folder (an empty one would be a server with no users)."""
    nats = services["nats"]
    cmd = command(nats)
    conf_target = cmd[cmd.index("--config") + 1]
    assert [m for m in mounts(nats) if m.target == conf_target and m.bind][0].source == "./deploy/nats/nats.conf"
    store = _store_mount(services)
    assert store.bind
    included = Path(conf_target).parent / include_of(CONF.read_text())
    assert included == Path(store.target) / CredentialStore(Path(store.source)).nats_auth_path.name
    (raw,) = [v for v in raw_compose()["services"]["nats"]["volumes"]
              if isinstance(v, dict) and v["target"] == store.target]
    assert raw.get("read_only") is True and raw.get("bind", {}).get("create_host_path") is False, raw


def test_the_store_is_kept_out_of_git_and_of_other_containers(services):
    source = _store_mount(services).source
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{source}/service.json"], cwd=ROOT, timeout=30)
    assert ignored.returncode == 0, f"{source} must be git-ignored: it holds every identity's seed"
    for name, s in services.items():
        if s.get("image") != services["nats"]["image"]:  # (the NATS servers: nats, and nats-2, nats-3 of "ha")
            assert not [m for m in mounts(s) if m.source == source], f"{name} mounts the credential store"


# ================================================================================================
# Valkey: the ACL of the credential module, on the command line
# ================================================================================================
def _valkey(args: list[str], workdir: Path):
    port = free_port()
    proc = subprocess.Popen([valkey_binary(), *args, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    _wait_port(port, proc, "valkey-server")
    return proc, port


def _acl_list(port: int, password: str) -> list[str]:
    r = redis.Redis(port=port, username="coorm", password=password, decode_responses=True)
    try:
        return sorted(r.execute_command("ACL", "LIST"))
    finally:
        r.close()


def test_valkey_runs_with_the_credential_module_s_acl(tmp_path):
    """The compose command's arguments, given to the local valkey-server (its data folder replaced): the
    default user is off, the services' user gets in with the password, and the ACL is the one a valkey
    configured with :func:`coorm.shared.credentials.valkey_acl` has."""
    password = "pw-" + "x" * 20
    cmd = command(compose({**env_example().values, **TEST_SECRETS, "COORM_REDIS_PASSWORD": password})
                  ["services"]["redis"])
    assert cmd[0] == "valkey-server"
    args = cmd[1:]
    i = args.index("--dir")
    del args[i:i + 2]
    (tmp_path / "compose").mkdir()
    (tmp_path / "module").mkdir()
    (tmp_path / "module" / "acl.conf").write_text("\n".join(valkey_acl(password)) + "\n")
    procs = []
    try:
        proc, port = _valkey(args, tmp_path / "compose")
        procs.append(proc)
        anonymous = redis.Redis(port=port)
        try:
            with pytest.raises(redis.exceptions.AuthenticationError):
                anonymous.ping()
        finally:
            anonymous.close()
        with pytest.raises(redis.exceptions.AuthenticationError):
            _acl_list(port, "not-" + password)
        proc2, port2 = _valkey([str(tmp_path / "module" / "acl.conf")], tmp_path / "module")
        procs.append(proc2)
        assert _acl_list(port, password) == _acl_list(port2, password)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def test_valkey_s_health_check_authenticates(deployed):
    """valkey-cli is not here to run it: the check names the services' user, takes the password from the
    container's environment (which has the one valkey runs with), and wants the PONG itself (an error reply
    such as NOAUTH is not a healthy server)."""
    store, _, services = deployed
    redis_svc = services["redis"]
    test = redis_svc["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    words = shlex.split(test[1])
    assert words[0] == "valkey-cli" and words[words.index("--user") + 1] == "coorm"
    assert words[words.index("--pass") + 1] == "$COORM_REDIS_PASSWORD"  # (compose's $$: the container's variable)
    assert environment(redis_svc)["COORM_REDIS_PASSWORD"] == store.valkey_password()
    assert f">{store.valkey_password()}" in command(redis_svc)
    assert test[1].rstrip().endswith("| grep -qx PONG")


def test_every_variable_of_the_compose_file_is_in_env_example():
    """With a value, or (the credentials `coorm user env` appends) commented out."""
    used = variables(COMPOSE.read_text())
    example = env_example()
    assert used, "the compose file uses no variable at all?"
    assert used <= example.documented, f"not in .env.example: {sorted(used - example.documented)}"
    assert used - set(example.values) <= set(TEST_SECRETS), sorted(used - set(example.values))


def _default(name: str):
    return Settings.model_fields[name].default


def test_env_example_lists_every_setting_with_its_default():
    env = env_example()
    missing = set(FIELDS) - env.documented
    assert not missing, f".env.example does not list {sorted(missing)}"
    assert EXTRAS <= env.documented, f"undocumented: {sorted(EXTRAS - env.documented)}"
    for var, value in env.values.items():
        if var in FIELDS:
            field = Settings.model_fields[FIELDS[var]]
            assert TypeAdapter(field.annotation).validate_python(value) == _default(FIELDS[var]), var


def test_compose_defaults_are_the_settings_defaults():
    for var, value in defaults(COMPOSE.read_text()).items():
        if var in FIELDS:
            field = Settings.model_fields[FIELDS[var]]
            assert TypeAdapter(field.annotation).validate_python(value) == _default(FIELDS[var]), var


# ================================================================================================
# health and restarts
# ================================================================================================
def test_every_service_has_a_health_check_and_a_restart_policy(services):
    for name, s in services.items():
        assert s.get("restart") in ("always", "unless-stopped") or str(s.get("restart", "")).startswith(
            "on-failure"), f"{name}: no restart policy"
        check = s.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name}: no health check"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def _health_command(service: dict) -> list[str]:
    test = service["healthcheck"]["test"]
    return test[1:] if test[0] == "CMD" else ["sh", "-c", test[1]]


def test_coorm_health_checks_are_real(services):
    """A health check of a CooRM container is either a ``coorm`` command (parsed) or Python code that compiles
    and fetches the metrics port the container's settings give."""
    for name, s in _coorm_services(services).items():
        test = s["healthcheck"]["test"]
        args = test[1:] if test[0] == "CMD" else shlex.split(test[1])
        if args[0] == "coorm":
            _parse(args[1:])
            continue
        assert args[:2] == ["python", "-c"], f"{name}: {test}"
        compile(args[2], f"{name} health check", "exec")
        port = environment(s).get("COORM_METRICS_PORT")
        if port:
            assert f"localhost:{port}/metrics" in args[2], f"{name}: the check must fetch its metrics port"


def test_the_metrics_health_check_tells_up_from_down(services):
    """The metrics check, run by the image's Python, passes against a live metrics endpoint and fails when
    there is none."""
    from prometheus_client import start_http_server

    from coorm.shared.servers import free_port

    code = _health_command(services["policy-engine"])[2]
    port = free_port()
    probe = code.replace("localhost:9100", f"127.0.0.1:{port}")
    assert probe != code
    server, thread = start_http_server(port, addr="127.0.0.1")
    try:
        ok = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    down = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30)
    assert down.returncode != 0


# ================================================================================================
# files the stack reads
# ================================================================================================
def test_what_is_mounted_or_built_exists(stack, services):
    store = _store_mount(services).source  # (made by coorm user init: test_nats_reads_the_users_of_the_store)
    for name, s in services.items():
        for m in mounts(s):
            if m.bind:
                assert m.source == store or (ROOT / m.source).exists(), f"{name} mounts {m.source}: no such file"
            else:
                assert m.source in (stack.get("volumes") or {}), f"{name}: undeclared volume {m.source}"
        if "build" in s:
            build = s["build"] if isinstance(s["build"], dict) else {"context": s["build"]}
            context = ROOT / build.get("context", ".")
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name


# ================================================================================================
# the Dockerfile
# ================================================================================================
def _ignored() -> list[str]:
    return [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
            if line.strip() and not line.startswith("#") and not line.startswith("!")]


def test_the_dockerfile_builds_a_slim_non_root_image_of_coorm():
    ins = dockerfile()
    final = max(i.stage for i in ins)
    for i in ins:
        if i.keyword == "FROM":
            assert i.json_or_words()[0] == "python:3.11-slim", i.args
    users = [i for i in ins if i.keyword == "USER" and i.stage == final]
    assert users and users[-1].args.split(":")[0] not in ("root", "0"), "the image must not run as root"
    entry = [i for i in ins if i.keyword == "ENTRYPOINT"]
    assert entry and entry[-1].stage == final and entry[-1].json_or_words() == ["coorm"]
    assert any(i.keyword == "RUN" and re.search(r"pip (install|wheel)\b.*(\s\.|\.whl)", i.args) for i in ins)


def test_the_dockerfile_copies_what_the_package_needs():
    copied = set()
    ignored = _ignored()
    for i in dockerfile():
        if i.keyword not in ("COPY", "ADD") or "--from=" in i.args:
            continue
        *sources, _dest = [w for w in i.json_or_words() if not w.startswith("--")]
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
            assert not any(Path(src).match(p.rstrip("/")) for p in ignored), f"COPY {src} is in .dockerignore"
            copied.add(src.rstrip("/").removeprefix("./"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, f"packages not copied into the image: {sorted(packages - copied)}"
    assert {"pyproject.toml", project["project"]["readme"]} <= copied
    scripts = project["tool"]["setuptools"]["script-files"]
    assert scripts == ["bin/coorm"] and "bin" in copied, "the image's ENTRYPOINT is the coorm script"


@pytest.mark.slow
def test_the_image_s_wheel_holds_what_compose_runs(tmp_path):
    """The build stage's ``pip wheel .`` on exactly what the Dockerfile copies, installed alone: the modules
    behind every command of the compose file import from it."""
    context = tmp_path / "context"
    context.mkdir()
    for i in dockerfile():
        if i.keyword == "COPY" and "--from=" not in i.args:
            *sources, _ = [w for w in i.json_or_words() if not w.startswith("--")]
            for src in sources:
                (shutil.copytree if (ROOT / src).is_dir() else shutil.copy)(ROOT / src, context / src)
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), "."],
                           cwd=context, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("coorm-*.whl")
    target = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    script = (target / "bin" / "coorm").read_text()  # the image's ENTRYPOINT
    assert script.startswith("#!") and "from coorm.cli.fast import main" in script
    modules = ["coorm.cli.main", "coorm.cli.live", "coorm.node_agent.agent", "coorm.services.accounting.tasks",
               *(f"coorm.services.{s.replace('-', '_')}.service" for s in SERVICES)]
    probe = ("import importlib, sys; mods = [importlib.import_module(m) for m in sys.argv[1:]]; "
             f"assert all(m.__file__.startswith({str(target)!r}) for m in mods), [m.__file__ for m in mods]")
    run = subprocess.run([sys.executable, "-c", probe, *modules], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert run.returncode == 0, run.stderr
