"""How a client finds CooRM and proves who it is, without the settings machinery: the connection file, the
``COORM_*`` variables it needs, the identity's secret. Light on purpose (the standard library only): the
command line's hot paths (``coorm batch``, ``coorm submit --no-wait``) read it on every call, and
:class:`coorm.shared.settings.Settings` reads the same file through it."""

from __future__ import annotations

import getpass
import json
import os
import stat
from pathlib import Path

# what ``coorm up`` writes in the connection file (the rest of the settings come from the environment)
FROM_FILE = ("nats_url", "redis_url", "nats_credentials", "credentials_dir")
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_CONNECT_TIMEOUT = 3.0


class CredentialsError(RuntimeError):
    pass


def connection_file() -> Path:
    """Where ``coorm up`` writes how to reach it (one per user and machine)."""
    explicit = os.environ.get("COORM_CONNECTION_FILE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "coorm" / "connection.json"


def file_values() -> dict[str, str]:
    """The connection file's values (none if it is missing or not what ``coorm up`` writes)."""
    try:
        data = json.loads(connection_file().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if k in FROM_FILE}


def redact(url: str) -> str:
    """The URL without its password (it goes into messages and logs)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()


def unreachable_text(url: str, source: str, seconds: float, *, lost: bool = False) -> str:
    """What a client says when CooRM cannot be reached (every client: the SDK and both command lines)."""
    where = f"{redact(url)} (from {source})" if source else redact(url)
    if lost:
        return f"lost CooRM at {where} and could not reach it again within {seconds:g} s"
    return f"cannot reach CooRM at {where} within {seconds:g} s: is it running? Start one with 'coorm up'"


def refused_text(url: str, who: tuple[str, str] | None) -> str:
    """What a client says when NATS refuses it: no credentials (``who`` None), or these (role, name)."""
    if who is None:
        return (f"CooRM at {redact(url)} wants credentials and this process has none: set "
                "COORM_NATS_CREDENTIALS to your identity file (an operator issues it: coorm user add NAME)")
    return (f"CooRM at {redact(url)} refused the credentials of {who[0]} {who[1]!r} "
            "(revoked or rotated? ask the operator for new ones: coorm user add --rotate)")


def read_secret(path: Path) -> str:
    """A secret file's text, refused if others than its owner may read it (as ssh refuses a key)."""
    try:
        st = path.stat()
        text = path.read_text()
    except OSError as e:
        raise CredentialsError(f"cannot read {path}: {e.strerror}") from e
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsError(f"{path} may be read by others (mode {stat.S_IMODE(st.st_mode):o}): chmod 600 it, "
                               "and have the credentials rotated if others did read it")
    return text


class Client:
    """What a user's command needs to reach CooRM: the NATS URL (and where it came from), the user's name
    and nkey seed, the connect timeout. The same precedence as ``Settings``: ``COORM_*`` variables, then
    the connection file, then the defaults."""

    def __init__(self) -> None:
        env = os.environ
        values = file_values()

        def get(name: str) -> tuple[str | None, str]:
            var = f"COORM_{name.upper()}"
            if var in env:
                return env[var], var
            if name in values:
                return values[name], str(connection_file())
            return None, "the default"

        url, self.url_source = get("nats_url")
        self.nats_url = url or DEFAULT_NATS_URL
        self.connect_timeout = float(env.get("COORM_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT))
        self.user, self.seed = self._identity(get("nats_credentials")[0], env.get("COORM_NATS_SEED"),
                                              get("credentials_dir")[0])

    @staticmethod
    def _identity(credentials: str | None, seed: str | None, store: str | None) -> tuple[str, str | None]:
        """The user and seed (``Settings.identity(Role.LAUNCHER)``): the identity file, else the seed of
        ``COORM_NATS_SEED``, else the user's own in the credential store, else none."""
        me = getpass.getuser()
        if credentials:
            return _from_json(read_secret(Path(credentials)), credentials)
        if seed:
            return me, seed
        if store:
            path = Path(store) / "users" / f"{me}.json"
            if path.exists():
                return _from_json(read_secret(path), str(path))
        return me, None


def _from_json(text: str, where: str) -> tuple[str, str]:
    try:
        data = json.loads(text)
        return str(data["name"]), str(data["seed"])
    except (ValueError, KeyError, TypeError) as e:
        raise CredentialsError(f"{where}: not a CooRM identity ({type(e).__name__})") from e
