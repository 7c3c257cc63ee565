"""Who may connect to CooRM's servers, and as whom: an identity per role (the services, the agents) and one
per user, each an nkey pair (ed25519) whose seed is a secret file readable by its owner only, and the
servers' configuration generated from them: the NATS users (public keys, each with the permissions the
endpoint table derives for it, :func:`coorm.shared.endpoints.permissions`) and the Valkey ACL (no default
user; the services' user with a generated password).

An operator's :class:`CredentialStore` is a directory (0700) that ``coorm up`` creates in its workdir (and
that ``coorm user add`` adds to)::

    service.json  agent.json  users/<name>.json   the identities (0600)
    valkey.json                                   the services' Valkey password (0600)
    nats-auth.conf                                the NATS ``authorization`` block, included by nats.conf

A user's identity also goes to the user (``~/.config/coorm/credentials.json``), and the user's programs
connect with it (``COORM_NATS_CREDENTIALS``). NATS checks the nkey's signature of the server's nonce, so the
seed never travels; the user's name in every subject is then one that NATS authenticated.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from coorm.shared import subjects
from coorm.shared.connection import CredentialsError, read_secret
from coorm.shared.endpoints import Role, permissions

# a POSIX user name that is also one NATS subject token (no dot, no wildcard)
USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,31}$")
VALKEY_USER = "coorm"  # the services' Valkey user




def check_user_name(name: str) -> str:
    if not USER_NAME.match(name):
        raise CredentialsError(f"{name!r} is not a user name CooRM accepts: a letter or _, then up to 31 letters, "
                               "digits, _ or - (it names NATS subjects)")
    return name


@dataclass(frozen=True)
class Identity:
    """A NATS identity: a role's (``name`` is the role's) or a user's (``role`` launcher, ``name`` the user)."""

    name: str
    role: Role
    seed: str  # the nkey seed (``SU...``): the secret

    @property
    def public_key(self) -> str:
        return _keypair(self.seed).public_key.decode()

    @property
    def inbox_prefix(self) -> str:
        """Where this connection's replies come: a prefix no other user may read."""
        if self.role is Role.LAUNCHER:
            return subjects.inbox_user(self.name)
        return subjects.INBOX_SERVICE if self.role is Role.SERVICE else subjects.INBOX_AGENT

    def sign(self, data: bytes) -> bytes:
        return _keypair(self.seed).sign(data)

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "role": self.role.value, "seed": self.seed}) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "") -> Identity:
        try:
            data = json.loads(text)
            ident = cls(name=str(data["name"]), role=Role(data["role"]), seed=str(data["seed"]))
            ident.public_key  # noqa: B018 - a seed that does not decode is refused here, not at connection
        except Exception as e:  # noqa: BLE001 - not JSON, a missing key, or a seed nkeys refuses (its own errors)
            raise CredentialsError(f"{where or 'credentials'}: not a CooRM identity ({type(e).__name__})") from e
        if ident.role is Role.LAUNCHER:
            check_user_name(ident.name)
        return ident


@functools.lru_cache(maxsize=16)
def _keypair(seed: str):
    """(Cached: the allocator signs each node's assignment; decoding the seed each time doubled the cost.)"""
    import nkeys

    return nkeys.from_seed(bytearray(seed.encode()))


def new_identity(name: str, role: Role) -> Identity:
    import nkeys

    if role is Role.LAUNCHER:
        check_user_name(name)
    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER).decode()
    return Identity(name=name, role=role, seed=seed)


def verify(public_key: str, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``public_key``'s over ``data``."""
    import base64
    import binascii

    import nacl.exceptions
    import nacl.signing
    import nkeys

    try:
        raw = base64.b32decode(public_key.encode() + b"=" * (-len(public_key) % 8))
        if len(raw) != 35 or raw[0] != nkeys.PREFIX_BYTE_USER or nkeys.crc16_checksum(raw[:-2]) != raw[-2:]:
            return False
        nacl.signing.VerifyKey(raw[1:-2]).verify(data, signature)
    except (ValueError, binascii.Error, nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError,
            nacl.exceptions.TypeError):
        return False
    return True


# what the services sign and the agents check: an assignment or a kill reaches an agent only through NATS
# permissions that let no one but the services publish it, and the agent still checks that a service
# signed it (a misconfigured server, or a leaked agent credential, must not hand nodes over)
SIGNATURE_HEADER = "Coorm-Signature"


def _signed(subject: str, data: bytes) -> bytes:
    return subject.encode() + b"\n" + data


def signature_headers(identity: Identity, subject: str, data: bytes) -> dict[str, str]:
    import base64

    return {SIGNATURE_HEADER: base64.b64encode(identity.sign(_signed(subject, data))).decode()}


def signed_by(public_key: str, subject: str, data: bytes, headers: dict[str, str] | None) -> bool:
    """Whether the message carries ``public_key``'s signature of its subject and data."""
    import base64
    import binascii

    value = (headers or {}).get(SIGNATURE_HEADER)
    if not value:
        return False
    try:
        signature = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return verify(public_key, _signed(subject, data), signature)


def write_secret(path: Path, text: str, *, uid: int | None = None, gid: int | None = None) -> Path:
    """Write ``text`` to ``path``, readable and writable by its owner only from the first byte on (created
    0600, then renamed over the old one); ``uid``/``gid``: give it to that user (root only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            if uid is not None:
                os.fchown(f.fileno(), uid, -1 if gid is None else gid)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def read_identity(path: Path) -> Identity:
    return Identity.from_json(read_secret(path), str(path))


class CredentialStore:
    """The operator's identities, and the servers' configuration generated from them."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- where things are ---------------------------------------------------------------------------
    def role_path(self, role: Role) -> Path:
        return self.root / f"{role.value}.json"

    def user_path(self, name: str) -> Path:
        return self.root / "users" / f"{check_user_name(name)}.json"

    @property
    def nats_auth_path(self) -> Path:
        return self.root / "nats-auth.conf"

    @property
    def nats_pid_path(self) -> Path:
        """Where a nats-server started with this store's configuration writes its pid (``-P``)."""
        return self.root / "nats-server.pid"

    def running_nats(self) -> int | None:
        """The pid of the store's nats-server if it runs on this machine. nats-server leaves its pid file
        behind when it stops, and a SIGHUP ends a process that does not handle it: a pid that now belongs to
        another program must not get one."""
        try:
            pid = int(self.nats_pid_path.read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return pid  # no /proc here: the pid file is all there is to go by
        return pid if comm.startswith("nats-server") else None

    def reload_nats(self) -> bool:
        """Tell the store's nats-server to read its users again (SIGHUP); False if none runs here."""
        import signal

        pid = self.running_nats()
        if pid is None:
            return False
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError:
            return False
        return True

    @property
    def valkey_path(self) -> Path:
        return self.root / "valkey.json"

    @property
    def service_key_path(self) -> Path:
        """The services' public key (not a secret): what agents check assignments and kills against."""
        return self.root / "service.pub"

    def service_key(self) -> str:
        return self.service_key_path.read_text().strip()

    # -- creating -----------------------------------------------------------------------------------
    def init(self, users: Iterable[str] = ()) -> CredentialStore:
        """The services' and agents' identities and the Valkey password (kept if there already), the
        ``users`` (idem), and the NATS configuration."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        for role in (Role.SERVICE, Role.AGENT):
            if not self.role_path(role).exists():
                write_secret(self.role_path(role), new_identity(role.value, role).to_json())
        self._write_service_key()
        if not self.valkey_path.exists():
            write_secret(self.valkey_path, json.dumps({"user": VALKEY_USER, "password": secrets.token_urlsafe(32)}))
        for name in users:
            if not self.user_path(name).exists():
                write_secret(self.user_path(name), new_identity(name, Role.LAUNCHER).to_json())
        self.write_nats_auth()
        return self

    def add_user(self, name: str, *, rotate: bool = False) -> Identity:
        """The user's identity: a new one if there is none (or ``rotate``: the old one stops working at the
        next reload of nats-server)."""
        path = self.user_path(name)
        if path.exists() and not rotate:
            return read_identity(path)
        ident = new_identity(name, Role.LAUNCHER)
        write_secret(path, ident.to_json())
        self.write_nats_auth()
        return ident

    def rotate_role(self, role: Role) -> Identity:
        ident = new_identity(role.value, role)
        write_secret(self.role_path(role), ident.to_json())
        self._write_service_key()
        self.write_nats_auth()
        return ident

    def _write_service_key(self) -> None:
        tmp = self.service_key_path.with_suffix(".tmp")
        tmp.write_text(self.role(Role.SERVICE).public_key + "\n")
        tmp.chmod(0o644)
        tmp.replace(self.service_key_path)

    def remove_user(self, name: str) -> bool:
        path = self.user_path(name)
        if not path.exists():
            return False
        path.unlink()
        self.write_nats_auth()
        return True

    # -- reading ------------------------------------------------------------------------------------
    def role(self, role: Role) -> Identity:
        return read_identity(self.role_path(role))

    def user(self, name: str) -> Identity:
        return read_identity(self.user_path(name))

    def users(self) -> list[str]:
        folder = self.root / "users"
        return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []

    def valkey_password(self) -> str:
        return str(json.loads(read_secret(self.valkey_path))["password"])

    def redis_url(self, host: str, port: int, db: int = 0) -> str:
        return f"redis://{VALKEY_USER}:{self.valkey_password()}@{host}:{port}/{db}"

    # -- the servers' configuration ------------------------------------------------------------------
    def identities(self) -> list[Identity]:
        return [self.role(Role.SERVICE), self.role(Role.AGENT), *(self.user(n) for n in self.users())]

    def write_nats_auth(self) -> Path:
        return write_secret(self.nats_auth_path, nats_authorization(self.identities()))

    def valkey_acl(self) -> list[str]:
        """Valkey configuration lines: no one but the services' user, with its password."""
        return valkey_acl(self.valkey_password())


def nats_authorization(identities: Iterable[Identity]) -> str:
    """The NATS ``authorization`` block: one nkey user per identity, with the permissions its role (a
    user's: scoped to the user) derives from the endpoint table, and nothing else (no anonymous access)."""
    entries = []
    for ident in identities:
        perms = permissions(ident.role, ident.name if ident.role is Role.LAUNCHER else None)
        grants: dict[str, object] = {"publish": {"allow": sorted(perms.publish)},
                                     "subscribe": {"allow": sorted(perms.subscribe)}}
        if perms.responses:
            grants["allow_responses"] = True
        entry = {"nkey": ident.public_key, "permissions": grants}
        entries.append(f"    # {ident.role.value}: {ident.name}\n    " + json.dumps(entry))
    return ("# generated by coorm (coorm.shared.credentials) from the endpoint table: do not edit; change the\n"
            "# users with `coorm user add|remove NAME`, `coorm user add --rotate NAME`, `coorm user rotate-services`\n"
            "authorization {\n  users = [\n" + "\n".join(entries) + "\n  ]\n}\n")


def valkey_acl(password: str) -> list[str]:
    return ["user default off", f"user {VALKEY_USER} on >{password} ~* &* +@all"]
