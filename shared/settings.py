"""Every setting of every CooRM process, read once (pydantic-settings): ``COORM_*`` environment variables
first, then the connection file that ``coorm up`` writes (so that ``coorm up`` in one terminal and
``coorm submit`` in another just work), then the defaults below."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


def connection_file() -> Path:
    """Where ``coorm up`` writes how to reach it (one per user and machine)."""
    explicit = os.environ.get("COORM_CONNECTION_FILE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "coorm" / "connection.json"


class _ConnectionFileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data().get(field_name), field_name, False

    def _data(self) -> dict:
        path = connection_file()
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if k in ("nats_url", "redis_url")}

    def __call__(self) -> dict[str, Any]:
        return self._data()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="COORM_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # a client (the command line, a launcher) gives up reaching CooRM after connect_timeout; once connected
    # it rides over a restart of the servers for reconnect_window, then ends with an error
    connect_timeout: float = Field(default=3.0, gt=0, le=600, description="seconds a client tries to connect")
    reconnect_window: float = Field(default=30.0, gt=0, description="seconds a client tries to reconnect")

    # the policy (DESIGN §4)
    reschedule_interval: float = Field(default=1.0, ge=0)
    fair_start: float = Field(default=5.0, ge=0)
    preempt_grace: float = Field(default=10.0, ge=0)
    preemptible: Literal["filling", "strict"] = "filling"
    view_period: float = Field(default=0.1, ge=0, description="seconds at least between two rounds of views")
    view_rate: float = Field(default=2000.0, gt=0, description="view notifications a second at most, all apps")

    # liveness
    launcher_heartbeat: float = Field(default=2.0, gt=0, description="how often a launcher says it is alive")
    session_timeout: float = Field(default=10.0, gt=0, description="a silent launcher's session is reaped")
    agent_heartbeat: float = Field(default=1.0, gt=0)
    agent_timeout: float = Field(default=5.0, gt=0, description="a silent agent's nodes go down")
    kill_grace: float = Field(default=5.0, ge=0, description="TERM, then KILL after this many seconds")
    # where an agent records the processes it runs, for a successor to find should it be killed
    agent_state_dir: Path | None = Field(default=None, description="default: $XDG_STATE_HOME/coorm/agents")
    agent_cgroups: bool = Field(default=True, description="contain launches in cgroups v2 where possible")
    leader_lease: float = Field(default=3.0, gt=0, description="the policy engine leader's lease in Redis")
    snapshot_every: int = Field(default=10_000, ge=0, description="events between two snapshots (0: none)")

    inventory: Path | None = Field(default=None, description="YAML: cluster speeds, WAN latencies/bandwidths")

    # observability: each process serves its Prometheus metrics here (0: a free port, unset: none)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_addr: str = "0.0.0.0"

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return init_settings, env_settings, _ConnectionFileSource(settings_cls), dotenv_settings

    def source_of(self, name: str) -> str:
        """Where a setting's value came from, in words a user can act on: the variable, the connection
        file, or the default."""
        var = f"COORM_{name.upper()}"
        if var in os.environ:
            return var
        if name in _ConnectionFileSource(type(self))():
            return str(connection_file())
        return "the default"

    def agent_state_path(self, agent_id: str) -> Path:
        base = self.agent_state_dir
        if base is None:
            state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
            base = Path(state) / "coorm" / "agents"
        safe = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in agent_id)
        return base / f"{safe}.json"

    def write_connection_file(self) -> Path:
        path = connection_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"nats_url": self.nats_url, "redis_url": self.redis_url}) + "\n")
        tmp.replace(path)
        return path
