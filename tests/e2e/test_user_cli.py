"""``coorm user`` as an operator runs it (subprocesses of the real command line) against a credential store
in tmp_path: what it writes and with which modes and owners, what it refuses, and that a running
nats-server started on the store (as ``coorm up`` starts it) lets a user in, shuts one out, and takes
rotated identities, each at once and without a restart."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from coorm.shared.credentials import CredentialStore, new_identity, read_identity
from coorm.shared.endpoints import Role
from coorm.shared.servers import start_servers
from coorm.shared.settings import Settings
from tests.deploy.natsserver import config_load_time, refused, wait_reloaded

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="installing for another user chowns: root only")
NOBODY = pwd.getpwnam("nobody")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The command's environment: none of this machine's COORM_* settings nor its connection file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORM_")}
    env.update({"COORM_CONNECTION_FILE": str(tmp_path / "no-connection.json"), "COLUMNS": "80", **extra})
    return env


def user(tmp_path: Path, *args: str, code: int = 0, **env: str) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, "-m", "coorm.cli.main", "user", *args], capture_output=True, text=True,
                         env=_env(tmp_path, **env), timeout=60)
    assert run.returncode == code, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    if code:
        assert len(run.stderr.strip().splitlines()) == 1 and run.stderr.startswith("coorm: "), run.stderr
    return run


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def store(tmp_path) -> CredentialStore:
    user(tmp_path, "init", "--store", str(tmp_path / "store"), "--user", "alice", "--user", "bob")
    return CredentialStore(tmp_path / "store")


# ================================================================================================
# the store
# ================================================================================================
def test_init_makes_a_store_only_its_owner_reads(tmp_path):
    run = user(tmp_path, "init", "--store", str(tmp_path / "store"), "--user", "alice", "--user", "bob")
    s = CredentialStore(tmp_path / "store")
    assert _mode(s.root) == 0o700
    assert s.users() == ["alice", "bob"]
    files = [p for p in s.root.rglob("*") if p.is_file()]
    assert {s.role_path(Role.SERVICE), s.role_path(Role.AGENT), s.valkey_path, s.nats_auth_path,
            s.user_path("alice"), s.user_path("bob"), s.service_key_path} == set(files)
    for p in files:
        # the services' public key is no secret (agents' hosts get it); everything else is
        assert _mode(p) == (0o644 if p == s.service_key_path else 0o600), p
    auth = s.nats_auth_path.read_text()
    assert all(i.public_key in auth for i in s.identities())
    assert "coorm user env --store" in run.stdout and "coorm user add NAME" in run.stdout

    # a second init keeps every identity
    before = {p: p.read_text() for p in files}
    again = user(tmp_path, "init", "--store", str(s.root))
    assert "kept" in again.stdout
    assert {p: p.read_text() for p in files} == before


def test_add_list_remove(tmp_path, store):
    run = user(tmp_path, "add", "carol", "--store", str(store.root))
    carol = store.user("carol")
    assert "added carol" in run.stdout
    assert _mode(store.user_path("carol")) == 0o600
    assert carol.public_key in store.nats_auth_path.read_text()
    # no server runs: the operator is told how to reach one in compose
    assert "docker compose kill -s HUP nats" in run.stdout
    assert f"{store.user_path('carol')}" in run.stdout  # where the identity is, to hand it over

    listing = user(tmp_path, "list", "--store", str(store.root)).stdout
    assert all(len(line) <= 80 for line in listing.splitlines()), listing
    for name in ("alice", "bob", "carol"):
        key = store.user(name).public_key
        assert name in listing and key[:8] in listing and key[-4:] in listing, listing
        assert key not in listing  # shortened, to fit
    assert "users/carol.json" in listing.replace("\n", "")  # (the path may be folded over lines)

    user(tmp_path, "remove", "carol", "--store", str(store.root))
    assert not store.user_path("carol").exists()
    assert carol.public_key not in store.nats_auth_path.read_text()
    assert store.users() == ["alice", "bob"]
    gone = user(tmp_path, "remove", "carol", "--store", str(store.root), code=1)
    assert "no user carol" in gone.stderr


def test_add_keeps_an_identity_unless_told_to_rotate(tmp_path, store):
    old = store.user("alice")
    user(tmp_path, "add", "alice", "--store", str(store.root))
    assert store.user("alice") == old
    run = user(tmp_path, "add", "alice", "--rotate", "--store", str(store.root))
    new = store.user("alice")
    assert new.public_key != old.public_key and "new identity" in run.stdout
    auth = store.nats_auth_path.read_text()
    assert new.public_key in auth and old.public_key not in auth


@pytest.mark.parametrize("name", ["a.b", "*", ">", "../etc", "-x", "Ω", "x" * 33])
def test_a_name_that_is_not_a_user_name_is_refused(tmp_path, store, name):
    before = store.nats_auth_path.read_bytes()
    run = user(tmp_path, "add", "--store", str(store.root), "--", name, code=2)
    assert "not a user name" in run.stderr
    assert store.nats_auth_path.read_bytes() == before
    assert store.users() == ["alice", "bob"]


def test_without_a_store_it_says_how_to_name_one(tmp_path):
    run = user(tmp_path, "add", "carol", code=2)
    assert "--store" in run.stderr
    not_one = tmp_path / "empty"
    not_one.mkdir()
    run = user(tmp_path, "list", "--store", str(not_one), code=2)
    assert "not a credential store" in run.stderr and "coorm user init" in run.stderr


def test_the_store_of_the_connection_file_is_the_default(tmp_path, store):
    """What coorm up leaves the operator: its connection file names the store."""
    conn = tmp_path / "conn.json"
    conn.write_text(json.dumps({"nats_url": "nats://127.0.0.1:1", "credentials_dir": str(store.root)}))
    user(tmp_path, "add", "dave", COORM_CONNECTION_FILE=str(conn))
    assert "dave" in store.users()


def test_env_prints_what_compose_needs(tmp_path, store):
    run = user(tmp_path, "env", "--store", str(store.root))
    service = store.role(Role.SERVICE)
    assert run.stdout.splitlines() == [
        f"COORM_SERVICE_SEED={service.seed}", f"COORM_AGENT_SEED={store.role(Role.AGENT).seed}",
        f"COORM_SERVICE_KEY={service.public_key}", f"COORM_REDIS_PASSWORD={store.valkey_password()}"]
    assert "secret" in run.stderr


def test_rotate_services_gives_new_service_and_agent_identities(tmp_path, store):
    old = {r: store.role(r) for r in (Role.SERVICE, Role.AGENT)}
    users = {n: store.user(n) for n in store.users()}
    run = user(tmp_path, "rotate-services", "--store", str(store.root))
    for r, ident in old.items():
        assert store.role(r).public_key != ident.public_key, r
        assert _mode(store.role_path(r)) == 0o600
    assert store.service_key() == store.role(Role.SERVICE).public_key
    assert {n: store.user(n) for n in store.users()} == users  # users keep theirs
    auth = store.nats_auth_path.read_text()
    assert all(i.public_key not in auth for i in old.values())
    assert "Restart the services and agents" in run.stdout


def test_a_stale_pid_file_gets_no_signal(tmp_path, store):
    """nats-server leaves its pid file behind: a pid now another program's must not get a SIGHUP (which
    would end it)."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        store.nats_pid_path.write_text(f"{other.pid}\n")
        run = user(tmp_path, "add", "carol", "--store", str(store.root))
        assert "no nats-server of this store runs" in run.stdout
        assert other.poll() is None, "the other program got the SIGHUP"
    finally:
        other.kill()
        other.wait()


# ================================================================================================
# handing the identity over
# ================================================================================================
def test_out_writes_the_identity_for_the_operator_to_hand_over(tmp_path, store):
    out = tmp_path / "handover" / "carol.json"
    user(tmp_path, "add", "carol", "--store", str(store.root), "--out", str(out))
    assert _mode(out) == 0o600
    assert read_identity(out) == store.user("carol")
    run = user(tmp_path, "add", "carol", "--store", str(store.root), "--out", str(out), "--install", code=2)
    assert "exclude" in run.stderr


def test_without_install_or_out_it_says_where_the_identity_is(tmp_path, store):
    """nobody's home does not exist: even as root, nothing is installed by default, and --install says why."""
    assert not Path(NOBODY.pw_dir).is_dir()
    run = user(tmp_path, "add", "nobody", "--store", str(store.root))
    assert f"{store.user_path('nobody')}" in run.stdout and "hand it to nobody" in run.stdout
    refused_install = user(tmp_path, "add", "nobody", "--store", str(store.root), "--install", code=2)
    assert "does not exist" in refused_install.stderr


@ROOT_ONLY
def test_install_writes_the_identity_and_a_connection_file_the_user_owns(tmp_path, store, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    run = user(tmp_path, "add", "nobody", "--store", str(store.root), "--install", "--home", str(home),
               COORM_NATS_URL="nats://login.example:4222")
    folder = home / ".config" / "coorm"
    identity, conn = folder / "credentials.json", folder / "connection.json"
    assert "installed for nobody" in run.stdout
    for d in (home / ".config", folder):
        st = d.lstat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, NOBODY.pw_gid, 0o700), d
    for f in (identity, conn):
        st = f.lstat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, NOBODY.pw_gid, 0o600), f
    assert read_identity(identity) == store.user("nobody")
    # NATS and the identity: no Redis URL, no store (users get neither)
    assert json.loads(conn.read_text()) == {"nats_url": "nats://login.example:4222", "nats_credentials": str(identity)}

    # what the user's commands read from it
    for k in [k for k in os.environ if k.startswith("COORM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("COORM_CONNECTION_FILE", str(conn))
    settings = Settings()
    assert settings.nats_url == "nats://login.example:4222" and settings.credentials_dir is None
    assert settings.identity(Role.LAUNCHER) == store.user("nobody")

    # --nats-url names another URL (the one users reach, which may not be the operator's)
    user(tmp_path, "add", "nobody", "--store", str(store.root), "--install", "--home", str(home),
         "--nats-url", "nats://coorm.example:4222")
    assert json.loads(conn.read_text())["nats_url"] == "nats://coorm.example:4222"


@ROOT_ONLY
def test_install_refuses_a_folder_that_is_a_link(tmp_path, store):
    """Root writing through a link the user planted would leave a file of theirs wherever it points."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (home / ".config").symlink_to(elsewhere)
    run = user(tmp_path, "add", "nobody", "--store", str(store.root), "--install", "--home", str(home), code=2)
    assert "link" in run.stderr
    assert list(elsewhere.rglob("*")) == []
    assert "nobody" not in store.users()  # refused before the store changed


@ROOT_ONLY
def test_install_leaves_the_user_s_own_coorm_up_connection_file(tmp_path, store):
    home = tmp_path / "home"
    folder = home / ".config" / "coorm"
    folder.mkdir(parents=True)
    own = json.dumps({"nats_url": "nats://127.0.0.1:5", "credentials_dir": "/their/store"})
    (folder / "connection.json").write_text(own)
    run = user(tmp_path, "add", "nobody", "--store", str(store.root), "--install", "--home", str(home))
    assert (folder / "connection.json").read_text() == own
    assert read_identity(folder / "credentials.json") == store.user("nobody")
    assert "left alone" in run.stdout


# ================================================================================================
# a running nats-server, as coorm up starts it
# ================================================================================================
async def test_a_running_server_takes_the_changes_without_a_restart(tmp_path):
    store_dir = tmp_path / "credentials"
    with start_servers(tmp_path / "servers", credentials=store_dir, monitor=True) as servers:
        s = CredentialStore(store_dir)
        url, monitor, nats = servers.nats_url, servers.monitor_port, servers.procs[0]
        assert monitor is not None

        def change(*args: str) -> subprocess.CompletedProcess:
            before = config_load_time(monitor)
            run = user(tmp_path, *args, "--store", str(store_dir))
            assert f"nats-server (pid {nats.pid}) was told" in run.stdout, run.stdout
            wait_reloaded(monitor, before)
            return run

        assert await refused(url, new_identity("dave", Role.LAUNCHER)) is not None  # (no key but the store's)
        change("add", "dave")
        dave = s.user("dave")
        assert await refused(url, dave) is None

        change("add", "dave", "--rotate")
        rotated = s.user("dave")
        assert await refused(url, rotated) is None
        assert await refused(url, dave) is not None

        change("remove", "dave")
        assert await refused(url, rotated) is not None

        service = s.role(Role.SERVICE)
        change("rotate-services")
        assert await refused(url, service) is not None
        assert await refused(url, s.role(Role.SERVICE)) is None
        assert nats.poll() is None  # the same process throughout: reloaded, never restarted
