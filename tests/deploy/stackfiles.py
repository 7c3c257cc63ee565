"""Reading the deployment files the way their tools do: docker-compose.yml with its ``${VAR}`` interpolation
from ``.env``, ``.env.example`` the way compose reads an env file, the Dockerfile instruction by
instruction. Shared by the tests of this folder."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA_PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
COMPOSE_SCHEMA = Path(__file__).resolve().parent / "data" / "compose-spec.json"

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, ${VAR:+alt}, $VAR; $$ is a literal $
_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
                  r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


class InterpolationError(ValueError):
    pass


def variables(text: str) -> set[str]:
    """Every variable a compose file's text refers to."""
    return {m["braced"] or m["plain"] for m in _VAR.finditer(text) if m.group(0) != "$$"}


def required(text: str) -> set[str]:
    """``${VAR:?error}`` / ``${VAR?error}``: the variables without which compose refuses to run."""
    return {m["braced"] for m in _VAR.finditer(text) if m["op"] in (":?", "?")}


def defaults(text: str) -> dict[str, str]:
    """``${VAR:-default}``: the default the compose file gives each variable."""
    return {m["braced"]: m["arg"] for m in _VAR.finditer(text) if m["op"] in (":-", "-")}


def interpolate(value, env: dict[str, str]):
    """Compose's interpolation of every string of a loaded compose file (keys are left alone)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m["braced"] or m["plain"]
        op, arg = m["op"], m["arg"] or ""
        val = env.get(name)
        empty = val is None or val == ""
        if op == ":-":
            return arg if empty else val
        if op == "-":
            return arg if val is None else val
        if op == ":?" and empty or op == "?" and val is None:
            raise InterpolationError(f"{name}: {arg}")
        if op == ":+":
            return "" if empty else arg
        if op == "+":
            return "" if val is None else arg
        return val or ""

    return _VAR.sub(one, value)


def raw_compose() -> dict:
    """The compose file as YAML (anchors and ``<<`` merge keys resolved), before interpolation."""
    return yaml.safe_load(COMPOSE.read_text())


@dataclass
class EnvFile:
    values: dict[str, str] = field(default_factory=dict)  # KEY=VALUE lines, as compose reads them
    documented: set[str] = field(default_factory=set)  # those and the commented-out examples (# KEY=...)


def env_example() -> EnvFile:
    """``.env.example`` read as compose reads an env file: ``KEY=VALUE``, an unquoted value's `` # comment``
    left out; commented-out ``# KEY=VALUE`` lines count as documented."""
    out = EnvFile()
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = re.match(r"^\s*(#\s*)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if not m:
            continue
        commented, key, value = m.groups()
        out.documented.add(key)
        if commented:
            continue
        value = value.strip()
        if value[:1] in ("'", '"'):
            value = value[1:value.index(value[0], 1)]
        else:
            value = re.split(r"\s+#", value, maxsplit=1)[0].strip()
        out.values[key] = value
    return out


# stand-ins for what `coorm user env` prints (the tests that need real ones make a store) and the Grafana password
TEST_SECRETS = {"COORM_SERVICE_SEED": "SUSERVICESEED", "COORM_AGENT_SEED": "SUAGENTSEED",
                "COORM_SERVICE_KEY": "USERVICEKEY", "COORM_REDIS_PASSWORD": "r3dis",
                "GRAFANA_ADMIN_PASSWORD": "gr4fana"}


def compose(env: dict[str, str] | None = None) -> dict:
    """The compose file as ``docker compose`` would run it with ``.env.example`` as ``.env`` and its secrets
    filled in."""
    if env is None:
        env = {**env_example().values}
        env.update({k: v for k, v in TEST_SECRETS.items() if not env.get(k)})
    return interpolate(raw_compose(), env)


def is_coorm(service: dict) -> bool:
    """A service running the CooRM image (built from the Dockerfile)."""
    return "build" in service or str(service.get("image", "")).startswith("coorm")


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def command(service: dict) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


@dataclass
class Mount:
    source: str
    target: str
    bind: bool  # a path of the host (else a named volume)


def mounts(service: dict) -> list[Mount]:
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            out.append(Mount(v.get("source", ""), v["target"], v.get("type") == "bind"))
            continue
        parts = v.split(":")
        source, target = parts[0], parts[1]
        out.append(Mount(source, target, source.startswith((".", "/", "~"))))
    return out


# ================================================================================================
# the Dockerfile, one instruction at a time
# ================================================================================================
@dataclass
class Instruction:
    stage: int
    keyword: str
    args: str

    def json_or_words(self) -> list[str]:
        text = self.args.strip()
        if text.startswith("["):
            return json.loads(text)
        return text.split()


def dockerfile() -> list[Instruction]:
    """Instructions with their continuation lines joined and comments left out; ``stage`` counts FROMs."""
    out: list[Instruction] = []
    stage = -1
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, args = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword, args.strip()))
    assert not pending, "the Dockerfile ends in a continuation line"
    return out
