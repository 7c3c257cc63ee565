"""``coorm user``: who may connect to CooRM. The operator's credential store
(:class:`coorm.shared.credentials.CredentialStore`) holds an nkey identity for the services, one for the
agents and one per user; nats-server's users are generated from it (``nats-auth.conf``), so every change here
ends with a new ``nats-auth.conf`` and, when this machine runs the store's nats-server, a SIGHUP to it.

Exit codes: 0 done; 1 nothing to do it to (``remove`` of a user the store does not have) or a file that
could not be written; 2 a usage error (no store, not a store, a name CooRM refuses, options that exclude each
other). Only ``typer`` is imported here: the rest when a command runs (the command line starts lean)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from coorm.shared.credentials import CredentialStore, Identity

app = typer.Typer(help="Who may connect: the credential store's users, and the services' and agents' "
                       "identities.", no_args_is_help=True)

_STORE_HELP = "the credential store (default: COORM_CREDENTIALS_DIR, or the one coorm up's connection file names)"
_COMPOSE_HUP = "docker compose kill -s HUP nats"


def _fail(text: str, code: int = 2) -> typer.Exit:
    sys.stderr.write(f"coorm: {text}\n")
    sys.stderr.flush()
    return typer.Exit(code)


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    """A refused identity file or an unwritable path as one line, not a traceback."""
    from coorm.shared.credentials import CredentialsError

    try:
        yield
    except CredentialsError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{e.filename or ''}: {e.strerror or e}", 1) from None


def _check_name(name: str) -> None:
    from coorm.shared.credentials import CredentialsError, check_user_name

    try:
        check_user_name(name)
    except CredentialsError as e:
        raise _fail(str(e)) from None


def _store(path: Path | None) -> CredentialStore:
    """The store to change: ``--store``, else the settings' (a store that ``init`` made: the services'
    identity is there)."""
    from coorm.shared.credentials import CredentialStore
    from coorm.shared.endpoints import Role
    from coorm.shared.settings import Settings, connection_file

    if path is None:
        path = Settings().credentials_dir
        if path is None:
            raise _fail(f"no credential store: give --store DIR, or set COORM_CREDENTIALS_DIR (coorm up names its "
                        f"own in {connection_file()})")
    store = CredentialStore(path)
    try:
        is_store = store.role_path(Role.SERVICE).is_file()
    except PermissionError:  # (is_file() says False for a folder it may not enter: a misleading answer)
        raise _fail(f"{path}: permission denied (a store is its owner's only: run this as its owner)", 1) from None
    if not is_store:
        raise _fail(f"{path} is not a credential store (no {store.role_path(Role.SERVICE).name}): "
                    f"create one with coorm user init --store {path}")
    return store


def _reload(store: CredentialStore, *, quiet_if_none: bool = False) -> bool:
    """Have the store's nats-server read its users again; say what happened, or what to do instead."""
    pid = store.running_nats()
    if pid is not None and store.reload_nats():
        typer.echo(f"nats-server (pid {pid}) was told to read its users again (SIGHUP): it applies the change "
                   "without a restart, and closes the connections of identities it no longer has")
        return True
    if not quiet_if_none:
        typer.echo(f"no nats-server of this store runs on this machine: if it runs in docker compose, "
                   f"`{_COMPOSE_HUP}`; otherwise the change takes effect when it next starts")
    return False


def _short(key: str) -> str:
    return f"{key[:8]}…{key[-4:]}"


# ================================================================================================
# installing a user's identity in their home
# ================================================================================================
def _account(name: str, home: Path | None) -> tuple[int, int, Path] | str:
    """NAME's uid, gid and home (``home`` instead of the password database's), or why there is none."""
    import pwd

    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return f"{name} is not a user of this machine"
    where = home if home is not None else Path(pw.pw_dir)
    if not where.is_dir():
        return f"{name}'s home {where} does not exist"
    return pw.pw_uid, pw.pw_gid, where


def _config_dir(home: Path, uid: int, gid: int) -> Path:
    """``HOME/.config/coorm``, made the user's where it is created. A folder on the way that is a link or
    belongs to someone else is refused: root writing through a link the user planted would drop a file of
    the user's wherever the link points."""
    import stat

    from coorm.shared.credentials import CredentialsError

    folder = home
    for part in (".config", "coorm"):
        folder = folder / part
        try:
            os.mkdir(folder, 0o700)
            os.chown(folder, uid, gid)
        except FileExistsError:
            pass
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (uid, 0):
            raise CredentialsError(f"{folder} is a link or another user's folder: not installing there")
    return folder


def _own_coorm_up(path: Path) -> bool:
    """Whether the connection file is one ``coorm up`` wrote (it names a credential store): the user runs
    their own CooRM there, and replacing the file would cut them off from it."""
    import json

    try:
        return bool(json.loads(path.read_text()).get("credentials_dir"))
    except (OSError, ValueError, AttributeError):
        return False


def _install(ident: Identity, uid: int, gid: int, folder: Path, nats_url: str) -> tuple[Path, Path | None]:
    """The identity and a connection file naming it (and NATS, nothing else: users get no Redis URL and no
    store) in the user's ``~/.config/coorm`` (``folder``), both 0600 and the user's; no connection file
    (None) where the user's own ``coorm up`` has one."""
    from coorm.shared.credentials import write_secret
    from coorm.shared.settings import Settings

    identity = write_secret(folder / "credentials.json", ident.to_json(), uid=uid, gid=gid)
    path = folder / "connection.json"
    if _own_coorm_up(path):
        return identity, None
    # redis_url="" and credentials_dir=None: write_connection_file leaves empty values out
    conn = Settings(nats_url=nats_url, redis_url="", nats_credentials=identity, credentials_dir=None)
    return identity, conn.write_connection_file(path, uid=uid, gid=gid)


# ================================================================================================
# the commands
# ================================================================================================
@app.command()
def add(
    name: str = typer.Argument(..., help="the user's login name (it names their NATS subjects)"),
    store_dir: Path | None = typer.Option(None, "--store", help=_STORE_HELP),
    rotate: bool = typer.Option(False, "--rotate", help="a new identity: the old one stops working"),
    out: Path | None = typer.Option(None, "--out", help="write the identity to this file (0600) to hand it over"),
    install: bool | None = typer.Option(
        None, "--install/--no-install",
        help="write it and a connection file into NAME's ~/.config/coorm (default: when run as root and NAME "
             "has a home here)"),
    nats_url: str | None = typer.Option(None, "--nats-url", help="the NATS URL the user's connection file names "
                                        "(default: this command's own)"),
    home: Path | None = typer.Option(None, "--home", hidden=True, help="NAME's home, instead of the passwd one's"),
) -> None:
    """Give NAME an identity (or, with --rotate, a new one), and let nats-server know."""
    _check_name(name)
    if out is not None and install:
        raise _fail("--out and --install exclude each other: the identity goes to one place")
    store = _store(store_dir)
    # where it goes, decided before the store changes: a refused --install changes nothing
    target: tuple[int, int, Path] | None = None  # uid, gid, ~NAME/.config/coorm
    if install or (install is None and out is None and os.geteuid() == 0):
        account = _account(name, home)
        if isinstance(account, str):
            if install:
                raise _fail(f"cannot install: {account}")
        elif os.geteuid() not in (0, account[0]):
            raise _fail(f"cannot install into {name}'s home: only root (or {name}) may")
        else:
            uid, gid, where = account
            with _reported():
                target = uid, gid, _config_dir(where, uid, gid)
    with _reported():
        existed = store.user_path(name).exists()
        ident = store.add_user(name, rotate=rotate)
        store.write_nats_auth()  # (also when the identity was there: a stale file is made right)
    if not existed:
        typer.echo(f"added {name} ({_short(ident.public_key)})")
    elif rotate:
        typer.echo(f"{name} has a new identity ({_short(ident.public_key)}): the old one is refused once "
                   "nats-server has read its users again")
    else:
        typer.echo(f"{name} already has an identity ({_short(ident.public_key)}): kept (--rotate replaces it)")
    _reload(store)

    with _reported():
        if out is not None:
            from coorm.shared.credentials import write_secret

            write_secret(out, ident.to_json())
            typer.echo(f"wrote {name}'s identity to {out} (0600): a secret, hand it to {name} where no one else can "
                       f"read it; {name}'s programs find it through COORM_NATS_CREDENTIALS (its path)")
        elif target is not None:
            from coorm.shared.settings import Settings

            uid, gid, folder = target
            identity, conn = _install(ident, uid, gid, folder, nats_url or Settings().nats_url)
            if conn is None:
                typer.echo(f"installed for {name}: {identity} (0600, {name}'s); {name}'s connection file is left "
                           f"alone (their own coorm up wrote it): COORM_NATS_CREDENTIALS={identity} reaches this "
                           "CooRM")
            else:
                typer.echo(f"installed for {name}: {identity} and {conn} (0600, {name}'s): the coorm commands "
                           "and launchers of that user find them")
        else:
            typer.echo(f"{name}'s identity is {store.user_path(name)}: a secret, hand it to {name} (or rerun with "
                       f"--out FILE, or as root with --install); {name}'s programs find it through "
                       "COORM_NATS_CREDENTIALS")


@app.command("list")
def list_users(store_dir: Path | None = typer.Option(None, "--store", help=_STORE_HELP)) -> None:
    """The store's users: name, public key, identity file."""
    from rich.console import Console
    from rich.table import Table

    from coorm.shared.credentials import CredentialsError

    store = _store(store_dir)
    with _reported():
        names = store.users()
    if not names:
        typer.echo(f"no users in {store.root} (coorm user add NAME)")
        return
    table = Table(title=f"users of {store.root}", title_justify="left")
    table.add_column("user", no_wrap=True)
    table.add_column("public key", no_wrap=True)
    table.add_column("identity file", overflow="fold")
    for n in names:
        try:
            key = _short(store.user(n).public_key)
        except CredentialsError as e:  # one bad file must not hide the others
            key = f"[red]{type(e).__name__}[/red]"
        table.add_row(n, key, str(store.user_path(n)))
    Console().print(table)


@app.command()
def remove(
    name: str = typer.Argument(..., help="the user"),
    store_dir: Path | None = typer.Option(None, "--store", help=_STORE_HELP),
) -> None:
    """Take NAME's identity away: nats-server refuses it (and closes its connections) once reloaded."""
    _check_name(name)
    store = _store(store_dir)
    with _reported():
        removed = store.remove_user(name)
    if not removed:
        raise _fail(f"no user {name} in {store.root}", 1)
    typer.echo(f"removed {name}: copies of the identity handed out no longer work (a copy in {name}'s home is "
               "left there, harmless)")
    _reload(store)


@app.command("rotate-services")
def rotate_services(store_dir: Path | None = typer.Option(None, "--store", help=_STORE_HELP)) -> None:
    """New identities for the services and the agents (and so a new service key, which agents check)."""
    from coorm.shared.endpoints import Role

    store = _store(store_dir)
    with _reported():
        service = store.rotate_role(Role.SERVICE)
        store.rotate_role(Role.AGENT)
    typer.echo(f"new service and agent identities in {store.root}; the service key is now {service.public_key}")
    reloaded = _reload(store)
    typer.echo(("Running services and agents were disconnected (their old identities are refused). "
                if reloaded else "")
               + "Restart the services and agents to pick the new ones up: coorm up, by restarting it; docker "
               "compose, `coorm user env --store STORE` into .env then `docker compose up -d`; agents on other "
               "hosts need the new agent identity and COORM_SERVICE_KEY.".replace("STORE", str(store.root)))


@app.command()
def init(
    store_dir: Path = typer.Option(..., "--store", help="where to create it (for docker compose: deploy/credentials)"),
    users: list[str] = typer.Option([], "--user", help="a user to add (repeat it for more)"),
) -> None:
    """Create a credential store, for docker compose or for servers run by hand (coorm up makes its own)."""
    from coorm.shared.credentials import CredentialStore
    from coorm.shared.endpoints import Role

    for n in users:
        _check_name(n)
    store = CredentialStore(store_dir)
    existed = store.role_path(Role.SERVICE).exists()
    with _reported():
        store.init(users=users)
    s = store.root
    who = ", ".join(store.users()) or "none yet"
    typer.echo(f"{'kept the credential store' if existed else 'created the credential store'} {s} (0700): "
               f"identities of the services and the agents, and of users ({who}); the Valkey password; "
               f"{store.nats_auth_path.name} (nats-server's users)")
    _reload(store, quiet_if_none=True)
    typer.echo(f"""Next:
  docker compose (the store must be deploy/credentials, which it mounts into nats):
    coorm user env --store {s} >> .env && chmod 600 .env && docker compose up -d
  servers run by hand:
    nats-server: `include "{store.nats_auth_path}"` in its configuration, and -P {store.nats_pid_path}
      (coorm user add then has it read its users again)
    valkey-server: the ACL `user default off` and `user coorm on >PASSWORD ~* &* +@all` (the password:
      coorm user env); services: COORM_CREDENTIALS_DIR={s} and COORM_REDIS_URL=redis://coorm:PASSWORD@HOST:PORT/0
    agents: COORM_NATS_CREDENTIALS={store.role_path(Role.AGENT)} (0600),
      COORM_SERVICE_KEY=$(cat {store.service_key_path})
  users: coorm user add NAME --store {s}""")


@app.command()
def env(store_dir: Path = typer.Option(..., "--store", help="the credential store")) -> None:
    """The .env lines docker compose needs from the store (secrets: on stdout, nowhere else)."""
    from coorm.shared.endpoints import Role

    store = _store(store_dir)
    with _reported():
        service, agent = store.role(Role.SERVICE), store.role(Role.AGENT)
        lines = [f"COORM_SERVICE_SEED={service.seed}", f"COORM_AGENT_SEED={agent.seed}",
                 f"COORM_SERVICE_KEY={service.public_key}", f"COORM_REDIS_PASSWORD={store.valkey_password()}"]
    sys.stderr.write("coorm: these are secrets (the services' and agents' seeds, the Valkey password): put them in "
                     "a .env only its owner reads (chmod 600 .env)\n")
    typer.echo("\n".join(lines))
