"""Every setting of every CooRM process, read once (pydantic-settings): ``COORM_*`` environment variables
first, then the connection file that ``coorm up`` writes (so that ``coorm up`` in one terminal and
``coorm submit`` in another just work), then the defaults below."""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import AliasChoices, Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from coorm.shared.connection import connection_file, file_values

if TYPE_CHECKING:
    from coorm.shared.credentials import Identity
    from coorm.shared.endpoints import Role

class _ConnectionFileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return file_values().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return file_values()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="COORM_", extra="ignore")

    # one NATS server, or several of a cluster, comma-separated: a client moves to another when its own goes
    nats_url: str = "nats://127.0.0.1:4222"
    redis_url: str = "redis://127.0.0.1:6379/0"  # with the services' user and password: redis://coorm:PW@...
    # Valkey under Sentinel (host:port,host:port,...): the primary of ``redis_master`` is asked of them, again
    # after a failover; redis_url then gives only the user, password and database (coorm.shared.valkey)
    redis_sentinel: str | None = Field(default=None, description="the sentinels: host:port,host:port,...")
    redis_master: str = Field(default="coorm", description="the name the sentinels monitor the primary by")
    # copies of the decision and lifecycle streams, on as many servers of the NATS cluster (1: one server)
    stream_replicas: int = Field(default=1, ge=1, le=5, description="JetStream replicas of CooRM's streams")
    # who this process is to NATS: its identity file (coorm.shared.credentials; 0600), or an operator's
    # credential store (what ``coorm up`` keeps) where each process finds its role's (a user's: their own)
    nats_credentials: Path | None = Field(default=None, description="this process's identity file (0600)")
    credentials_dir: Path | None = Field(default=None, description="an operator's credential store")
    # or the identity's seed itself (a container's secret from the environment): the role's, or the login user's
    nats_seed: str | None = Field(default=None, description="this process's nkey seed (S...), instead of a file")
    # the services' public key: an agent obeys only assignments and kills the services signed (default: the
    # credential store's service.pub)
    service_key: str | None = Field(default=None, description="the services' public nkey (U...)")
    # a launch may not set these variables (fnmatch patterns): code injected into the user's programs
    launch_env_deny: list[str] = Field(default_factory=lambda: ["LD_PRELOAD", "LD_AUDIT"])
    # a client (the command line, a launcher) gives up reaching CooRM after connect_timeout; once connected
    # it rides over a restart of the servers for reconnect_window, then ends with an error
    connect_timeout: float = Field(default=3.0, gt=0, le=600, description="seconds a client tries to connect")
    reconnect_window: float = Field(default=30.0, gt=0, description="seconds a client tries to reconnect")

    # the policy (DESIGN §4)
    reschedule_interval: float = Field(default=1.0, ge=0)
    # passes that may run at once within an interval (a request on a quiet system is scheduled without
    # waiting for the interval; a burst of them is coalesced)
    pass_burst: int = Field(default=16, ge=1)
    fair_start: float = Field(default=5.0, ge=0)
    preempt_grace: float = Field(default=10.0, ge=0)
    # how the preemptible capacity is shared among malleable applications: filling, strict, fpsma, egs
    # (COORM_PREEMPTIBLE, its former name, still works); precedence to running (KOALA's PRA) or waiting
    # (PWA) applications; nodes per cluster never handed to malleable work. The policy engine checks the
    # names and refuses to start on one it does not know (any other command does not read them)
    malleable_policy: str = Field(default="filling", validation_alias=AliasChoices(
        "coorm_malleable_policy", "coorm_preemptible", "malleable_policy"))
    precedence: str = "waiting"
    local_threshold: int = Field(default=0, ge=0, description="nodes per cluster never handed to malleable work")
    view_period: float = Field(default=0.1, ge=0, description="seconds at least between two rounds of views")
    view_rate: float = Field(default=2000.0, gt=0, description="view notifications a second at most, all apps")

    # liveness
    launcher_heartbeat: float = Field(default=2.0, gt=0, description="how often a launcher says it is alive")
    session_timeout: float = Field(default=10.0, gt=0, description="a silent launcher's session is reaped")
    heartbeat_rate: float = Field(default=1000.0, gt=0, description="session heartbeats a second, all sessions, "
                                  "at most: past it, sessions beat less often (and are reaped later)")
    heartbeat_longest: float = Field(default=30.0, gt=0, description="seconds between a session's heartbeats, "
                                     "at most, however many sessions")
    agent_heartbeat: float = Field(default=1.0, gt=0)
    agent_timeout: float = Field(default=5.0, gt=0, description="a silent agent's nodes go down")
    service_probe: float = Field(default=2.0, gt=0, description="how often a service asks JetStream through its "
                                 "NATS server, to leave one cut from its cluster")
    kill_grace: float = Field(default=5.0, ge=0, description="TERM, then KILL after this many seconds")
    # where an agent records the processes it runs, for a successor to find should it be killed
    agent_state_dir: Path | None = Field(default=None, description="default: $XDG_STATE_HOME/coorm/agents")
    agent_cgroups: bool = Field(default=True, description="contain launches in cgroups v2 where possible")
    # launches are forked by a small spawner process (node_agent/spawner.py): a fork of the agent itself costs
    # it some 5 ms of CPU per launch; off: the agent forks them
    agent_spawner: bool = Field(default=True, description="fork launches from a small spawner process")
    leader_lease: float = Field(default=3.0, gt=0, description="the policy engine leader's lease in Redis")
    snapshot_every: int = Field(default=10_000, ge=0, description="events between two snapshots (0: none)")

    inventory: Path | None = Field(default=None, description="YAML: cluster speeds, WAN latencies/bandwidths")

    # the batch queue
    batch_max_array: int = Field(default=100_000, ge=1, description="tasks an array may have at most")
    batch_history_days: float = Field(default=30.0, gt=0, description="days an ended batch job stays in the history")
    # an array's tasks run in a task farm: one session for the array, slots that run its tasks one after the
    # other (services/batch/farm.py); so do a user's separate jobs of one shape (cluster, nodes, walltime) that
    # are not attached. Off: each job or task is a batch job of its own, with its own session
    batch_farm: bool = Field(default=True,
                             description="run an array's tasks, and a user's separate jobs of one shape, in task farms")
    # a request for more nodes than its cluster has (up or down) is refused: it could never start. CooRM's
    # paper lets such a request wait (nodes may be added): the operator may choose that
    oversize_waits: bool = Field(default=False, description="let a request larger than its cluster wait")

    # observability: each process serves its Prometheus metrics here (0: a free port, unset: none)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_addr: str = "0.0.0.0"

    @model_validator(mode="after")
    def _sentinel_in_url(self) -> Settings:
        """With sentinels, ``redis_url`` becomes the Sentinel form: every consumer of the URL (services,
        Celery, the command line) reads the one string (coorm.shared.valkey)."""
        if self.redis_sentinel:
            from coorm.shared import valkey

            if valkey.parse(self.redis_url) is None:
                self.redis_url = valkey.sentinel_url(self.redis_url, self.redis_sentinel, self.redis_master)
        return self

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

    def identity(self, role: Role) -> Identity | None:
        """Who this process connects as: the identity file if one is set, else its role's in the credential
        store (a launcher's: its user's), else none (a server that wants credentials refuses it)."""
        from coorm.shared.credentials import CredentialStore, Identity, read_identity
        from coorm.shared.endpoints import Role

        if self.nats_credentials is not None:
            return read_identity(self.nats_credentials)
        if self.nats_seed:
            name = getpass.getuser() if role is Role.LAUNCHER else role.value
            return Identity.from_json(json.dumps({"name": name, "role": role.value, "seed": self.nats_seed}),
                                      "COORM_NATS_SEED")
        if self.credentials_dir is None:
            return None
        store = CredentialStore(self.credentials_dir)
        if role is Role.LAUNCHER:
            path = store.user_path(getpass.getuser())
            return read_identity(path) if path.exists() else None
        return store.role(role)

    def service_public_key(self) -> str | None:
        from coorm.shared.credentials import CredentialStore

        if self.service_key:
            return self.service_key
        if self.credentials_dir is not None:
            path = CredentialStore(self.credentials_dir).service_key_path
            if path.exists():
                return path.read_text().strip()
        return None

    def write_connection_file(self, path: Path | None = None, *, uid: int | None = None,
                              gid: int | None = None) -> Path:
        """How to reach CooRM, for the other commands of this user (or, with ``uid``, of that user): the
        URLs and credentials, so readable by its owner only."""
        from coorm.shared.credentials import write_secret

        data = {"nats_url": self.nats_url, "redis_url": self.redis_url,
                "nats_credentials": str(self.nats_credentials) if self.nats_credentials else None,
                "credentials_dir": str(self.credentials_dir) if self.credentials_dir else None}
        return write_secret(path or connection_file(), json.dumps({k: v for k, v in data.items() if v}) + "\n",
                            uid=uid, gid=gid)


def explain(err: Exception) -> list[str] | None:
    """A :class:`Settings` that could not be read, as one line per variable (its name, the value given, what
    it must be) for a command to print instead of a traceback; None for any other error."""
    from pydantic import ValidationError

    if not (isinstance(err, ValidationError) and err.title == Settings.__name__):
        return None
    lines = []
    for e in err.errors():
        name = str(e["loc"][0]) if e["loc"] else ""
        var = name if name.upper().startswith("COORM_") else f"COORM_{name.upper()}"
        lines.append(f"{var}={e.get('input')!r}: {e['msg']}")
    return lines
