"""The ``coorm`` script, and the batch commands users run by the thousand, kept fast.

``coorm batch``, ``coorm submit --no-wait``, ``cancel``, ``hold`` and ``release`` are one request each to the
batch service. Through the full
command line they cost about a second of CPU (typer, rich, pydantic's models, pydantic-settings, nats-py);
here they cost what Python's own start does: the options are read by :mod:`coorm.batch.jobscript`, the
connection by :mod:`coorm.shared.connection`, and the request goes over NATS's text protocol on a plain
socket (CONNECT signed with the user's nkey, SUB to the user's inbox, PUB, one reply). The batch service
validates the message as any other (``BatchSubmit``), so nothing is trusted for being sent this way.

Anything this path does not know -- ``--help``, an option it does not read, a ``tls://`` URL -- goes to the
full command line (:mod:`coorm.cli.main`), which says what the user did wrong. Its failures say what the
full one says, with the same exit codes: 2 refused, 3 CooRM not reachable."""

from __future__ import annotations

import _socket  # (socket's own module: socket imports enum and selectors, 8 ms of a 60 ms command)
import os
import sys
import time

from coorm.shared import lightjson as json  # (json imports re: 10-15 ms)

TYPE_CHECKING = False  # (not typing's: see coorm.shared.connection)
if TYPE_CHECKING:
    from collections.abc import Callable

EXIT_REFUSED, EXIT_UNREACHABLE = 2, 3
RETRY_NO_RESPONDERS = 10.0  # seconds past the connect timeout a request nobody serves is sent again (round the list)
REPLY_WITHIN = 10.0  # seconds a request waits for its reply (over all its sends, for one sent again)
RESEND_AFTER = 2.0  # seconds after which a request safe to send twice is sent again (then 4 s...)

# coorm batch's options: the value-taking ones (as in #COORM directives), and the flags
_VALUED = {"-N", "--nodes", "-t", "--time", "-J", "--job-name", "-o", "--output", "-e", "--error", "-a", "--array",
           "-d", "--dependency", "-D", "--chdir", "--export", "-c", "--cluster", "-p", "--partition"}
_FLAGS = {"-H", "--hold"}
_OWN = {"--wrap", "--open-mode"}  # read here, not directives
# coorm submit's
_SUBMIT_VALUED = {"-c": "--cluster", "--cluster": "--cluster", "-N": "--nodes", "--nodes": "--nodes", "-t": "--time",
                  "--time": "--time", "-o": "--output", "--output": "--output", "-J": "--job-name",
                  "--job-name": "--job-name"}


class Fallback(Exception):
    """Not for this path: the full command line takes the command as it was typed."""


class Failed(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def main() -> None:
    """The ``coorm`` script."""
    argv = sys.argv[1:]
    try:
        code = run(argv)
    except Fallback:
        code = None
    except Failed as e:
        _say(str(e))
        code = e.code
    if code is None:
        from coorm.cli.main import main as full

        full()
        return
    raise SystemExit(code)


def run(argv: list[str]) -> int | None:
    """The exit code of a command this path handles, or None (or :class:`Fallback`) for the others."""
    if argv[:1] == ["batch"]:
        return batch(argv[1:])
    if argv[:1] == ["queue"]:
        return queue(argv[1:])
    if argv[:1] == ["history"]:
        return history(argv[1:])
    if argv[:1] in (["cancel"], ["hold"], ["release"]):
        return control(argv[0], argv[1:])
    if argv[:1] == ["submit"]:
        if "--no-wait" in argv[1:argv.index("--") if "--" in argv else len(argv)]:
            return submit_no_wait(argv[1:])
        from coorm.cli import attach

        return attach.submit(argv[1:])
    return None


# ================================================================================================
# the commands
# ================================================================================================
def batch(argv: list[str]) -> int:
    """``coorm batch [OPTIONS] SCRIPT [ARGS]`` or ``coorm batch [OPTIONS] --wrap CMD``."""
    from coorm.batch import jobscript

    options: list[str] = []
    wrap: str | None = None
    open_mode = "append"
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=")
        if not a.startswith("-") or a == "-":
            break
        if a == "--":
            i += 1
            break
        if name in _OWN:
            if not eq:
                if i + 1 >= len(argv):
                    raise Fallback
                value, i = argv[i + 1], i + 1
            if name == "--wrap":
                wrap = value
            elif value in ("append", "truncate"):
                open_mode = value
            else:
                raise Fallback
        elif a in _FLAGS:
            options.append(a)
        elif name in _VALUED and eq:
            options.append(a)
        elif a in _VALUED:
            if i + 1 >= len(argv):
                raise Fallback
            options += [a, argv[i + 1]]
            i += 1
        elif len(a) > 2 and a[:2] in _VALUED and not a.startswith("--"):  # -N4
            options.append(a)
        else:
            raise Fallback  # --help, an option this path does not read
        i += 1
    rest = argv[i:]
    if (wrap is None) == (not rest):
        raise Failed("give a script (coorm batch job.sh) or --wrap 'COMMAND'", EXIT_REFUSED)
    if wrap is not None:  # (its directives are read as a script's would be)
        text, name, args = f"#!/bin/sh\n{wrap}\n", "wrap", rest
    else:
        path, args = rest[0], rest[1:]
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise Failed(f"cannot read {path}: {getattr(e, 'strerror', None) or e}", EXIT_REFUSED) from None
        name = os.path.basename(path)
    try:
        directives, warnings = jobscript.parse_script(text)
        given, more = jobscript.parse_options(options, dialect="coorm")
    except jobscript.ScriptError as e:
        raise Failed(f"{rest[0] if wrap is None else 'the wrapped command'}: {e}", EXIT_REFUSED) from None
    for w in [*warnings, *more]:
        _say(w)
    return submit_job(directives.merged(given), argv=args, script=text if wrap is None else None, wrap=wrap,
                      default_name=name, open_mode=open_mode)


def submit_no_wait(argv: list[str]) -> int:
    """``coorm submit --no-wait [OPTIONS] -- COMMAND``: the command, queued (sbatch --wrap)."""
    opts, _, command = submit_options(argv)
    return submit_job(opts, argv=command, script=None, default_name=os.path.basename(command[0]))


def submit_options(argv: list[str]):
    """``coorm submit``'s options (as :class:`~coorm.batch.jobscript.JobOptions`), whether ``-l`` was
    given, and the command."""
    from coorm.batch.jobscript import JobOptions

    given: dict[str, str] = {}
    label = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        a = argv[i]
        name, eq, value = a.partition("=")
        if a in ("--no-wait", "-l", "--label"):
            label = label or a != "--no-wait"
            i += 1
            continue
        if name in _SUBMIT_VALUED and (eq or i + 1 < len(argv)):
            if not eq:
                value, i = argv[i + 1], i + 1
            given[_SUBMIT_VALUED[name]] = value
            i += 1
            continue
        if not a.startswith("-"):
            break  # the command (typer takes it without --)
        raise Fallback
    command = argv[i + 1:] if i < len(argv) and argv[i] == "--" else argv[i:]
    if not command:
        raise Failed("nothing to run: coorm submit -N NODES -t TIME -- COMMAND ARGS...", EXIT_REFUSED)
    try:
        nodes = int(given["--nodes"]) if "--nodes" in given else 1
    except ValueError:
        raise Fallback from None
    if nodes < 1:
        raise Fallback
    opts = JobOptions(nodes=nodes, time=given.get("--time", "10m"), name=given.get("--job-name"),
                      output=given.get("--output"), cluster=given.get("--cluster"))
    return opts, label, command


def submit_job(opts, *, argv: list[str], script: str | None, default_name: str, open_mode: str = "append",
               wrap: str | None = None) -> int:
    """Send one submission; print ``Submitted batch job N`` (as sbatch does: scripts read the id from it)."""
    from coorm.shared import subjects

    message = submission(opts, argv=argv, script=script, default_name=default_name, open_mode=open_mode)
    if wrap is not None:
        message["wrap"] = wrap
    reply = request(subjects.batch_submit, message, "the batch service", resend=True)
    print(f"Submitted batch job {reply['job']}")
    return 0


def submission(opts, *, argv: list[str], script: str | None, default_name: str, open_mode: str = "append") -> dict:
    """The ``BatchSubmit`` message, its values checked as the batch service checks them (``Failed``, 2)."""
    from coorm.batch import jobscript
    from coorm.shared.when import parse_walltime

    try:
        walltime = parse_walltime(opts.time or "10m")
        if opts.array:
            jobscript.parse_array(opts.array)
        if opts.dependency:
            jobscript.parse_dependency(opts.dependency)
        env = jobscript.export_environment(jobscript.parse_export(opts.export), os.environ)
    except ValueError as e:  # (ScriptError is one)
        raise Failed(f"cannot submit: {e}", EXIT_REFUSED) from None
    cwd = os.path.abspath(opts.chdir) if opts.chdir else os.getcwd()
    message = {"argv": argv, "script": script, "nodes": opts.nodes or 1, "walltime": walltime,
               "cluster": opts.cluster, "name": (opts.name or default_name)[:128], "output": opts.output,
               "error": opts.error, "open_mode": open_mode, "array": opts.array, "dependency": opts.dependency,
               "hold": bool(opts.hold), "env": env, "cwd": cwd,
               "submission": os.urandom(16).hex()}  # (sent again, it is answered with the job it made)
    return {k: v for k, v in message.items() if v is not None}


def _listing_options(argv: list[str], valued: tuple[str, ...]) -> dict[str, str]:
    """``-u U``, ``--user U``, ``--user=U``, ``--json`` and the ``valued`` options (long and short forms):
    {name: value}; :class:`Fallback` for anything else (``--state``, ``--help``: the full command line)."""
    names = {"-u": "user", "--user": "user"}
    for o in valued:
        names[o] = valued[0].lstrip("-")  # (every form of an option under its long name)
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        key, eq, value = a.partition("=")
        if a == "--json":
            out["json"] = ""
        elif eq and key.startswith("--") and key in names:
            out[names[key]] = value
        elif a in names and i + 1 < len(argv):
            out[names[a]] = argv[i + 1]
            i += 1
        else:
            raise Fallback
        i += 1
    return out


def queue(argv: list[str]) -> int:
    """``coorm queue [-u USER] [--json]`` (squeue): the jobs not ended, a page at a time over one connection,
    printed from their JSON (no models: ten thousand jobs in well under a second)."""
    opts = _listing_options(argv, ())
    body: dict = {"user": opts["user"]} if "user" in opts else {}
    from coorm.shared import subjects

    now, jobs = pages(subjects.BATCH_QUERY, body, "the batch service")
    if "json" in opts:
        _print_json(jobs)
        return 0
    from coorm.cli.table import print_queue

    print_queue(jobs, now)
    return 0


def history(argv: list[str]) -> int:
    """``coorm history [-u USER] [--since WHEN] [--json]`` (sacct): the jobs ended since then (default: the
    last day), as the full command line prints them -- scripts poll it."""
    from coorm.shared import subjects
    from coorm.shared.when import parse_since

    opts = _listing_options(argv, ("--since", "-S"))
    try:
        since = parse_since(opts["since"], time.time()) if "since" in opts else time.time() - 86400
    except ValueError:
        raise Fallback from None  # (the full command line says what is wrong with it)
    body: dict = {"ended": True, "since": since, **({"user": opts["user"]} if "user" in opts else {})}
    _, jobs = pages(subjects.BATCH_QUERY, body, "the batch service")
    if "json" in opts:
        _print_json(jobs)
        return 0
    from coorm.cli.table import print_history

    print_history(jobs)
    return 0


def _print_json(jobs: list[dict]) -> None:
    from coorm.shared.lightjson import dumps_indented

    sys.stdout.write(dumps_indented(jobs) + "\n")
    sys.stdout.flush()


def control(verb: str, argv: list[str]) -> int:
    """``coorm cancel|hold|release JOBID... [-n NAME]`` (scancel, scontrol hold/release): the jobs named, or
    the user's of that name. ``--state``, ``--user``, ``--help``, an id that is not one: the full command
    line, which says what is wrong."""
    from coorm.shared import subjects
    from coorm.shared.jobids import is_job_id

    jobs: list[str] = []
    name: str | None = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-n", "--name") and i + 1 < len(argv):
            name, i = argv[i + 1], i + 2
            continue
        if a.startswith("--name="):
            name = a.partition("=")[2]
        elif is_job_id(a):
            jobs.append(a)
        else:
            raise Fallback
        i += 1
    if (not jobs and name is None) or (name is not None and not 0 < len(name) <= 128):
        raise Fallback
    subject = {"cancel": subjects.batch_cancel, "hold": subjects.batch_hold, "release": subjects.batch_release}[verb]
    body: dict = {"jobs": jobs} if name is None else {"jobs": jobs, "name": name}
    body["command"] = os.urandom(16).hex()  # (sent again, it is answered as the first was: not done twice)
    return report_control(verb, request(subject, body, "the batch service", resend=True), jobs)


def report_control(verb: str, reply: dict, named: list[str]) -> int:
    """What ``cancel``, ``hold`` and ``release`` print (both command lines): the jobs changed on stdout, those
    named but not in a state for it on stderr; exit 1 if nothing named was changed."""
    past = {"cancel": "cancelled", "hold": "held", "release": "released"}[verb]
    changed, unchanged = list(reply.get("jobs", ())), list(reply.get("unchanged", ()))
    if changed:
        print(f"{past} {len(changed)} job{'s' if len(changed) != 1 else ''}: {_ids(changed)}")
    if unchanged:
        _say(f"not {past} ({'already ended' if verb == 'cancel' else 'not in a state for it'}): {_ids(unchanged)}")
    return 1 if not changed and (unchanged or named) else 0


def _ids(ids: list[str], most: int = 20) -> str:
    return ", ".join(ids[:most]) + (f" and {len(ids) - most} more" if len(ids) > most else "")


PAGE = 2000  # jobs per reply (BatchQuery's most)


def pages(subject: str, body: dict, service: str) -> tuple[float, list[dict]]:
    """Every job a ``BatchQuery`` names, a page at a time over one connection: (the service's now, jobs)."""
    client, where = socket_client()
    asker = _Asker(client, where)
    jobs: list[dict] = []
    with asker:
        while True:
            data = asker.ask(subject, json.dumps({**body, "offset": len(jobs), "limit": PAGE}).encode(), resend=True)
            if data is None:
                raise no_service(where, service)
            reply = json.loads(data)
            refuse_error(reply)
            jobs += reply["jobs"]
            if not reply["jobs"] or len(jobs) >= reply["total"]:  # (fewer than when the first page was read)
                return reply["now"], jobs


# ================================================================================================
# one request over NATS's text protocol
# ================================================================================================
def request(subject_of: Callable[[str], str], body: dict, service: str, resend: bool = False) -> dict:
    """``body`` on the user's subject ``subject_of(user)``; the reply, or :class:`Failed` as the full command
    line words it. ``resend``: safe to send twice (:meth:`_Asker.ask`)."""
    from coorm.shared.connection import Client, CredentialsError, redact

    try:
        client = Client()
    except CredentialsError as e:
        raise Failed(str(e), EXIT_REFUSED) from None
    url = client.nats_url
    where = f"{redact(url)} (from {client.url_source})"
    payload = json.dumps(body).encode()
    subject = subject_of(client.user)
    if not all(u.startswith("nats://") for u in url.split(",")):
        data = _via_nats_py(subject, payload, resend)  # TLS, websockets: nats-py's
    else:
        data = _via_socket(client, subject, payload, where, resend)
    if data is None:
        raise no_service(where, service)
    reply = json.loads(data)
    refuse_error(reply)
    return reply


def no_service(where: str, service: str) -> Failed:
    """NATS answered for the subject with "no responders" for as long as this path waits."""
    return Failed(f"NATS at {where} answers but {service} does not: is it running? Start one with 'coorm up'",
                  EXIT_UNREACHABLE)


def refuse_error(reply: dict) -> None:
    """:class:`Failed` (2) if ``reply`` is an error reply (``{"ok": false, "error": {...}}``)."""
    if reply.get("ok") is False and isinstance(reply.get("error"), dict):
        raise Failed(f"refused: {reply['error'].get('message')}", EXIT_REFUSED)


def _via_nats_py(subject: str, payload: bytes, resend: bool) -> bytes | None:
    import asyncio

    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    from coorm.shared import bus
    from coorm.shared.connection import nats_servers
    from coorm.shared.endpoints import Role
    from coorm.shared.settings import Settings

    settings = Settings()

    async def go() -> bytes:
        nc = await bus.connect_client(settings.nats_url, "coorm-cli", timeout=settings.connect_timeout,
                                      reconnect_window=settings.reconnect_window,
                                      source=settings.source_of("nats_url"), identity=settings.identity(Role.LAUNCHER))
        try:  # (nobody serving it there: asked again, through another server of the list, as _Asker does)
            return (await bus.request_moving(nc, nats_servers(settings.nats_url), subject, payload,
                                             timeout=REPLY_WITHIN, within=RETRY_NO_RESPONDERS, name="coorm-cli",
                                             identity=settings.identity(Role.LAUNCHER),
                                             resend_after=RESEND_AFTER if resend else None)).data
        finally:
            await bus.shutdown(nc)

    try:
        return asyncio.run(go())
    except NoRespondersError:
        return None
    except (bus.Unreachable, bus.Refused) as e:
        raise Failed(str(e), EXIT_UNREACHABLE if isinstance(e, bus.Unreachable) else EXIT_REFUSED) from None
    except (NatsTimeout, TimeoutError):
        raise Failed(f"CooRM at {bus.redact(settings.nats_url)} did not answer in time", EXIT_UNREACHABLE) from None


def _via_socket(client, subject: str, payload: bytes, where: str, resend: bool) -> bytes | None:
    with _Asker(client, where) as asker:
        return asker.ask(subject, payload, resend)


class _Asker:
    """Requests over one connection, signed in as the user. A request that no one serves -- a service
    restarting, or this server cut from its cluster (alive, reaching nothing, its services gone to the
    others) -- took nothing, so it is sent again for :data:`RETRY_NO_RESPONDERS` past the connect timeout,
    as the SDK does for a policy engine's take-over, through the next server of the list (round it);
    :class:`Failed` as the full command line words it for a lost or silent connection."""

    def __init__(self, client, where: str) -> None:
        self.client, self.where = client, where
        self.conn = connect(client, where)
        self.give_up = self.conn.deadline + RETRY_NO_RESPONDERS
        self.inbox, self.asked = "", 0
        self.subscribed: Conn | None = None  # (the connection the inbox is subscribed on)

    def __enter__(self) -> _Asker:
        return self

    def __exit__(self, kind, error, tb) -> None:
        self.conn.sock.close()
        if isinstance(error, TimeoutError):
            raise Failed(f"CooRM at {self.where} did not answer in time", EXIT_UNREACHABLE) from None
        if isinstance(error, (OSError, ValueError)):
            raise Failed(self.conn.unreachable, EXIT_UNREACHABLE) from None

    def ask(self, subject: str, payload: bytes, resend: bool = False) -> bytes | None:
        """The reply's payload; None when no server of the list had it served until the end. ``resend``: the
        request is safe to send twice (a query; a submission carrying its own id), so one unanswered after
        :data:`RESEND_AFTER`, then twice as long, is sent again -- its reply lost as a service moved, or
        late -- for :data:`REPLY_WITHIN` in all; the first reply to come is taken."""
        from coorm.shared.connection import Resends  # (already loaded: the client came from it)

        delay, resends = 0.05, Resends(REPLY_WITHIN, RESEND_AFTER if resend else None, time.monotonic())
        self.asked += 1  # (a reply subject of its own: a late reply to an earlier request is not this one's)
        while True:
            conn, sub = self.conn, b""
            if self.subscribed is not conn:  # (the SUB with a connection's first request: one write, one trip)
                self.inbox, self.subscribed = f"{conn.inbox}.{os.urandom(8).hex()}", conn
                sub = f"SUB {self.inbox}.* 1\r\n".encode()
            reply_to = f"{self.inbox}.{self.asked}"
            conn.sock.settimeout(resends.timeout(time.monotonic()))
            conn.send(sub + f"PUB {subject} {reply_to} {len(payload)}\r\n".encode() + payload + b"\r\nPING\r\n")
            try:
                data = conn.reply(reply_to)
            except TimeoutError:
                if not resends.retry(time.monotonic()):
                    raise
                continue  # (what was read of a reply stays buffered: the next read goes on from there)
            if data is not None or time.monotonic() + delay > self.give_up:
                return data
            self.conn = self._next_server()
            if self.conn.first:  # (every server of the list said so: a pause before the next round)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _next_server(self) -> Conn:
        """A connection through the server after this one's in the list (this one with a one-server list)."""
        if "," not in self.client.nats_url:
            self.conn.first = True
            return self.conn
        self.conn.sock.close()
        return connect(self.client, self.where, after=self.conn.server)


def socket_client():
    """The user's :class:`~coorm.shared.connection.Client` and where it reaches CooRM (for messages), for
    this path's plain socket; :class:`Fallback` for a URL it does not read (TLS)."""
    from coorm.shared.connection import Client, CredentialsError, redact

    try:
        client = Client()
    except CredentialsError as e:
        raise Failed(str(e), EXIT_REFUSED) from None
    if not all(u.startswith("nats://") for u in client.nats_url.split(",")):
        raise Fallback  # the full command line (nats-py) reads those
    return client, f"{redact(client.nats_url)} (from {client.url_source})"


def connect(client, where: str, after: int = -1) -> Conn:
    """A NATS connection on a plain socket, signed in as the user (CONNECT answered), or :class:`Failed` as
    the full command line words it; :class:`Fallback` for a URL this path does not read. Through the first
    server of the list that answers, looked for from the one after the ``after``-th (round the list)."""
    from coorm.shared import subjects
    from coorm.shared.connection import CredentialsError, refused_text, sign_nonce, unreachable_text

    unreachable = unreachable_text(client.nats_url, client.url_source, client.connect_timeout)
    deadline = time.monotonic() + client.connect_timeout
    sock = None
    urls = client.nats_url.split(",")
    for server in [(after + 1 + k) % len(urls) for k in range(len(urls))]:  # a cluster's: the first that answers
        url = urls[server]
        try:
            parts = _Url(url.strip())
        except ValueError:
            raise Fallback from None  # (the full command line says what is wrong with it)
        try:
            # the host as bytes: a str would be encoded by the idna codec, which costs its import
            sock = _open(parts.hostname, parts.port, max(0.1, deadline - time.monotonic()))
            break
        except (OSError, UnicodeError):
            continue
    if sock is None:
        raise Failed(unreachable, EXIT_UNREACHABLE)
    try:
        # each of our writes goes at once: Nagle would hold the request back until the server's delayed
        # acknowledgement of the previous write (40 ms)
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        conn = Conn(sock, subjects.inbox_user(client.user), deadline, unreachable)
        conn.server, conn.first = server, server <= after or after < 0
        info = json.loads(conn.expect("INFO ")[5:])
        hello: dict = {"verbose": False, "pedantic": False, "lang": "python", "version": "coorm-fast", "protocol": 1,
                       "headers": True, "no_responders": True, "name": "coorm-cli"}
        if parts.username:
            hello |= {"user": parts.username, "pass": parts.password or ""}
        if info.get("nonce") and client.seed:
            try:
                public, signature = sign_nonce(client.seed, info["nonce"].encode())
            except CredentialsError as e:
                raise Failed(str(e), EXIT_REFUSED) from None
            hello |= {"nkey": public, "sig": signature}
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        conn.send(f"CONNECT {json.dumps(hello)}\r\nPING\r\n".encode())
        line = conn.line()
        if line.startswith("-ERR"):
            who = None if client.seed is None else ("launcher", client.user)
            raise Failed(refused_text(url, who), EXIT_REFUSED)
        return conn
    except (OSError, ValueError):
        sock.close()
        raise Failed(unreachable, EXIT_UNREACHABLE) from None
    except BaseException:
        sock.close()
        raise


def _open(host: str, port: int, timeout: float) -> _socket.socket:
    """``socket.create_connection``: the first of the host's addresses that accepts."""
    error: OSError = OSError(f"{host}: no address")
    # (the host as bytes: a str would be encoded by the idna codec, which costs its import)
    for family, kind, proto, _, address in _socket.getaddrinfo(host.encode(), port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error


class _Url:
    """``nats://[user[:password]@]host[:port]`` read as ``urlsplit`` reads it (urllib.parse costs 4 ms to
    import); anything else, e.g. an IPv6 literal, is left to the full command line (ValueError)."""

    def __init__(self, url: str) -> None:
        rest = url.removeprefix("nats://").split("/", 1)[0]
        creds, at, hostport = rest.rpartition("@")
        host, colon, port = hostport.partition(":")
        if not host or "[" in hostport or (colon and not port.isdigit()):
            raise ValueError(url)
        self.hostname, self.port = host, int(port) if colon else 4222
        user, has_password, password = creds.partition(":")
        self.username = user if at else None
        self.password = password if has_password else None


class Conn:
    """A NATS connection on a plain socket: what is written, and what is read (lines, messages)."""

    def __init__(self, sock: _socket.socket, inbox: str, deadline: float, unreachable: str) -> None:
        self.sock, self.buf = sock, b""
        self.inbox = inbox  # the user's reply prefix: NATS lets the user read nothing else's
        self.deadline = deadline  # (of the connect timeout)
        self.unreachable = unreachable  # what to say when it is lost
        self.server = 0  # its server's place in the URL list
        self.first = True  # the list's first server answering, or one looked for past the list's end

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        self.buf += chunk

    def line(self) -> str:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode()

    def take(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def frame(self) -> tuple[str, bytes | None]:
        """The next line, with its payload for a message (``MSG``/``HMSG``: headers and body). A timeout of
        the socket leaves what was read buffered: the next call goes on from there."""
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line = self.buf[:end].decode()
                if not line.startswith(("MSG ", "HMSG ")):
                    self.buf = self.buf[end + 2:]
                    return line, None
                size = int(line.split()[-1])
                if len(self.buf) >= end + 2 + size + 2:
                    data, self.buf = self.buf[end + 2:end + 2 + size], self.buf[end + 2 + size + 2:]
                    return line, data
            self._fill()

    def expect(self, prefix: str) -> str:
        line = self.line()
        if not line.startswith(prefix):
            raise ValueError(line)
        return line

    def reply(self, to: str | None = None) -> bytes | None:
        """The reply's payload (to the subject ``to`` only, when given: another is an earlier request's, late);
        None when no one serves the subject (a 503 status, as no_responders asks)."""
        while True:
            line = self.line()
            if line == "PING":
                self.send(b"PONG\r\n")
            elif line.startswith("MSG "):
                fields = line.split()
                data = self.take(int(fields[-1]))
                if to is None or fields[1] == to:
                    return data
            elif line.startswith("HMSG "):
                fields = line.split()
                hdr, total = int(fields[-2]), int(fields[-1])
                raw = self.take(total)
                if to is not None and fields[1] != to:
                    continue
                if raw[:hdr].split(b"\r\n", 1)[0].split()[1:2] == [b"503"]:
                    return None
                return raw[hdr:]
            elif line.startswith("-ERR"):
                if "Permissions Violation" in line:  # the subject is not the user's
                    raise Failed(f"NATS refused: {line[5:].strip(chr(39))}", EXIT_REFUSED)
                raise ConnectionError(line)
            # +OK, PONG, INFO: nothing to read


def _say(text: str) -> None:
    sys.stderr.write(f"coorm: {text}\n")
    sys.stderr.flush()


if __name__ == "__main__":  # (python -m coorm.cli.fast: run as the module the others import, one Failed class)
    from coorm.cli.fast import main as _main

    _main()
