"""How a client finds CooRM and proves who it is, without the settings machinery: the connection file, the
``COORM_*`` variables it needs, the identity's secret. Light on purpose (the standard library only): the
command line's hot paths (``coorm batch``, ``coorm submit --no-wait``) read it on every call, and
:class:`coorm.shared.settings.Settings` reads the same file through it."""

from __future__ import annotations

import os
import stat

from coorm.shared import lightjson

TYPE_CHECKING = False  # (not typing's: importing typing costs the hot paths 5 ms)
if TYPE_CHECKING:
    from pathlib import Path

# what ``coorm up`` writes in the connection file (the rest of the settings come from the environment)
FROM_FILE = ("nats_url", "redis_url", "nats_credentials", "credentials_dir")
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_CONNECT_TIMEOUT = 3.0


class CredentialsError(RuntimeError):
    pass


class Resends:
    """How long each send of a request waits for its reply, and whether an unanswered one is sent again: a
    request safe to send twice (``first`` seconds: a query, a submission carrying its own id) is sent again
    after ``first`` seconds, then twice as long, for ``within`` seconds in all; any other waits ``within`` once.
    The one policy of the light path's socket and of nats-py's requests; times are the caller's clock."""

    def __init__(self, within: float, first: float | None, now: float) -> None:
        self.wait, self.by, self.again = first or within, now + within, first is not None

    def timeout(self, now: float) -> float:
        """This send's wait."""
        return max(0.1, min(self.wait, self.by - now))

    def retry(self, now: float) -> bool:
        """Unanswered: whether to send again (then the next wait is twice as long)."""
        if not self.again or now >= self.by:
            return False
        self.wait *= 2
        return True


def connection_file() -> Path:
    """Where ``coorm up`` writes how to reach it (one per user and machine)."""
    from pathlib import Path

    return Path(_connection_path())


def _connection_path() -> str:
    # (os.path, not pathlib: the hot paths do not import pathlib and what it imports)
    explicit = os.environ.get("COORM_CONNECTION_FILE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "coorm", "connection.json")


def file_values() -> dict[str, str]:
    """The connection file's values (none if it is missing or not what ``coorm up`` writes)."""
    try:
        with open(_connection_path(), encoding="utf-8") as f:
            data = lightjson.loads(f.read())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if k in FROM_FILE}


def nats_servers(url: str) -> list[str]:
    """The servers of a NATS URL list (``nats://a:4222,nats://b:4222``: a cluster's), in order."""
    return [u.strip() for u in url.split(",") if u.strip()]


def redact(url: str) -> str:
    """The URL without its password (it goes into messages and logs); each of a list."""
    if "," in url:
        return ",".join(redact(u) for u in nats_servers(url))
    if "@" not in url:  # (no password: the hot paths do not import urllib.parse)
        return url
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


def read_secret(path: str | os.PathLike[str]) -> str:
    """A secret file's text, refused if others than its owner may read it (as ssh refuses a key)."""
    try:
        with open(path, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            text = f.read()
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
                return values[name], _connection_path()
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
        me = _login_name()
        if credentials:
            return _from_json(read_secret(credentials), credentials)
        if seed:
            return me, seed
        if store:
            path = os.path.join(store, "users", f"{me}.json")
            if os.path.exists(path):
                return _from_json(read_secret(path), path)
        return me, None


def _login_name() -> str:
    """``getpass.getuser()``, without the terminal modules getpass imports."""
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if os.environ.get(var):
            return os.environ[var]
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _from_json(text: str, where: str) -> tuple[str, str]:
    try:
        data = lightjson.loads(text)
        return str(data["name"]), str(data["seed"])
    except (ValueError, KeyError, TypeError) as e:
        raise CredentialsError(f"{where}: not a CooRM identity ({type(e).__name__})") from e


_SEED_PREFIX = 18 << 3  # nkeys' 'S'


def sign_nonce(seed: str, nonce: bytes) -> tuple[str, str]:
    """(public nkey, base64 signature of ``nonce``) for NATS's CONNECT, as ``nkeys`` computes them, by
    libsodium's Ed25519 directly: ``nkeys`` imports all of PyNaCl (12 ms), which the hot paths cannot pay (nor
    base64's import of re: base 32 is done here, base 64 by binascii)."""
    import binascii

    from nacl._sodium import ffi, lib  # type: ignore[import-not-found]  # (PyNaCl's binding of libsodium)

    raw = _b32decode(seed)
    if (raw is None or len(raw) != 36 or raw[0] & 0xF8 != _SEED_PREFIX
            or _crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little")):
        raise CredentialsError("the identity's seed is not an nkey seed")
    role = (raw[0] & 0x07) << 5 | (raw[1] & 0xF8) >> 3
    if lib.sodium_init() < 0:  # pragma: no cover - libsodium cannot start
        raise CredentialsError("libsodium failed to initialise")
    public, secret = ffi.new("unsigned char[32]"), ffi.new("unsigned char[64]")
    lib.crypto_sign_seed_keypair(public, secret, raw[2:34])
    signed = ffi.new("unsigned char[]", 64 + len(nonce))  # the signature, then the message
    lib.crypto_sign(signed, ffi.NULL, nonce, len(nonce), secret)
    key = bytes([role]) + ffi.buffer(public)[:]
    return (_b32encode(key + _crc16(key).to_bytes(2, "little")),
            binascii.b2a_base64(ffi.buffer(signed, 64)[:], newline=False).decode())


_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"  # RFC 4648's alphabet, as nkeys writes it: without padding


def _b32encode(data: bytes) -> str:
    bits = size = 0
    out = []
    for byte in data:
        bits, size = (bits << 8 | byte) & 0xFFFF, size + 8
        while size >= 5:
            size -= 5
            out.append(_B32[bits >> size & 31])
    if size:
        out.append(_B32[bits << (5 - size) & 31])
    return "".join(out)


def _b32decode(text: str) -> bytes | None:
    """The bytes, or None for a text that is not unpadded base 32."""
    bits = size = 0
    out = bytearray()
    for char in text:
        value = _B32.find(char)
        if value < 0:
            return None
        bits, size = (bits << 5 | value) & 0xFFFF, size + 5
        if size >= 8:
            size -= 8
            out.append(bits >> size & 0xFF)
    return bytes(out)


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM, nkeys' checksum."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = (crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1
        crc &= 0xFFFF
    return crc
