"""``coorm submit`` the way ``srun`` is used: submit, stream the job's output, exit with its exit code.

The job is a batch job *attached* to this command (``BatchSubmit.attach``): the batch service hosts it as any
other (its session, its request, its launches: nothing of it lives in this process), and sends what happens
to it -- its start, its processes' output, its end -- to a subject of the user's own inbox that this command
listens to. So the command costs what ``coorm batch`` costs, plus the job's own time; it appears in ``coorm
queue`` and ``coorm history`` as any job does. Its life is tied to this command's, as srun's is:

* Ctrl-C (or SIGTERM, SIGHUP) cancels the job and waits (a few seconds) for it to end; a second Ctrl-C
  leaves at once. Exit code 130 (143 for SIGTERM, 129 for SIGHUP), as a shell's.
* A command killed outright (SIGKILL, its host gone) stops listening: the batch service notices within
  ``ATTACH_GRACE`` seconds and cancels the job.
* A NATS restart cuts the connection: the command connects again within the reconnect window, listens
  again, and asks the queue what became of the job meanwhile (its end, if it ended; the output sent while it
  was away is lost). Lost for good: exit 3, saying the job may still run.
* CooRM stopping as a whole (``SystemStopping``): exit 3 with the reason.

The exit code is the job's (``BatchAttached.exit_code``: its command's, 124 at its walltime, 127 for a
command not found...); 2 when the submission is refused; 3 when CooRM cannot be reached."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (signal's own module: signal imports enum)
import os
import sys
import time

from coorm.cli.fast import (
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    RETRY_NO_RESPONDERS,
    Conn,
    Failed,
    connect,
    no_service,
    refuse_error,
    socket_client,
    submission,
    submit_options,
)
from coorm.shared import lightjson as json  # (json imports re)

RECONNECT_WINDOW = 30.0  # Settings.reconnect_window's default: seconds a client tries to connect again
CANCEL_WAIT = 10.0  # seconds a cancelled job's end is waited for after Ctrl-C
SILENCE = 10.0  # seconds without a word from the server before it is PINGed (the batch service probes every 2 s)
_SIGNALS = {_signal.SIGINT: 130, _signal.SIGTERM: 143, _signal.SIGHUP: 129}
_EVENTS, _REPLIES, _STOPPING = "1", "2", "3"  # subscription ids


def submit(argv: list[str]) -> int:
    """``coorm submit [-c CLUSTER] [-N NODES] [-t TIME] [-J NAME] [-o FILE] [-l] -- COMMAND ARGS...``."""
    opts, label, command = submit_options(argv)
    output = opts.output
    message = submission(opts._replace(output=None), argv=command, script=None,
                         default_name=os.path.basename(command[0]))
    client, where = socket_client()
    sink = open(output, "a", buffering=1) if output else None  # noqa: SIM115 - closed below
    try:
        return _Attached(client, where, message, label, sink).run()
    except KeyboardInterrupt:  # (before its signal handlers were set: nothing was submitted)
        return 130
    finally:
        if sink is not None:
            sink.close()


class _Attached:
    def __init__(self, client, where: str, message: dict, label: bool, sink) -> None:
        self.client, self.where, self.label, self.sink = client, where, label, sink
        self.conn: Conn = connect(client, where)
        self.attach = f"{self.conn.inbox}.{os.urandom(8).hex()}"
        self.replies = f"{self.conn.inbox}.{os.urandom(8).hex()}"
        self.message = {**message, "attach": self.attach}
        self.job: str | None = None
        self.signalled: int | None = None  # the exit code of the signal that came
        self.cancel_by: float | None = None
        self.no_responders = False  # the last submission was served by no one
        self.heard = time.monotonic()  # when the server last sent anything (it is PINGed when silent)

    # -- the job's life -----------------------------------------------------------------------------
    def run(self) -> int:
        from coorm.shared import subjects

        for sig in _SIGNALS:
            _signal.signal(sig, self._on_signal)
        try:
            self._listen()
            self._submit()
            while True:
                if self.signalled is not None and self.cancel_by is None:
                    self.cancel_by = time.monotonic() + CANCEL_WAIT
                    # (lost with the connection: the service cancels the job once this command is gone)
                    try:
                        self._publish(subjects.batch_cancel(self.client.user), {"jobs": [self.job]}, self.replies)
                    except OSError:
                        pass
                if self.cancel_by is not None and time.monotonic() > self.cancel_by:
                    _say(f"job {self.job} was cancelled; its end was not seen within {CANCEL_WAIT:g} s")
                    return self.signalled or 1
                try:
                    code = self._next()
                except TimeoutError:
                    code = self._silence()
                except (OSError, ValueError):
                    code = self._reconnect()
                if code is not None:
                    return self.signalled or code
        finally:
            self.conn.sock.close()

    def _on_signal(self, signum: int, _frame) -> None:
        if self.signalled is not None:  # the second: leave now (the job was asked to end)
            raise SystemExit(self.signalled)
        self.signalled = _SIGNALS[signum]

    def _listen(self) -> None:
        from coorm.shared import subjects

        self.conn.send(f"SUB {self.attach} {_EVENTS}\r\nSUB {self.replies} {_REPLIES}\r\n"
                       f"SUB {subjects.SYSTEM_STOPPING} {_STOPPING}\r\n".encode())

    def _publish(self, subject: str, body: dict, reply: str) -> None:
        payload = json.dumps(body).encode()
        self.conn.send(f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n")

    def _submit(self) -> None:
        """Send the submission; the job's id, once its reply came (no one serving it: sent again, as
        ``coorm batch`` does)."""
        from coorm.shared import subjects

        deadline = time.monotonic() + self.client.connect_timeout + RETRY_NO_RESPONDERS
        delay = 0.05
        self.conn.sock.settimeout(10.0)
        while True:
            self._publish(subjects.batch_submit(self.client.user), self.message, self.replies)
            self.no_responders = False
            try:
                while self.job is None and not self.no_responders:
                    self._next()
            except TimeoutError:
                raise Failed(f"CooRM at {self.where} did not answer in time", EXIT_UNREACHABLE) from None
            except (OSError, ValueError):
                raise Failed(self.conn.unreachable, EXIT_UNREACHABLE) from None
            if self.job is not None:
                self.conn.sock.settimeout(0.5)  # (signals are looked at between reads)
                return
            if time.monotonic() + delay > deadline:
                raise no_service(self.where, "the batch service")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- what comes -----------------------------------------------------------------------------------
    def _next(self) -> int | None:
        """Read one frame and act on it: the exit code once the job ended, None otherwise."""
        frame = self.conn.frame()
        self.heard = time.monotonic()
        return self._handle(*frame)

    def _silence(self) -> int | None:
        """Nothing came for a while: the server is PINGed (its PONG is something heard); silent for
        twice as long, the connection is taken for lost (a host gone, a cable cut: no TCP reset comes)."""
        quiet = time.monotonic() - self.heard
        if quiet > 2 * SILENCE:
            return self._reconnect()
        if quiet > SILENCE:
            try:
                self.conn.send(b"PING\r\n")
            except OSError:
                return self._reconnect()
        return None

    def _handle(self, line: str, data: bytes | None) -> int | None:
        if line == "PING":
            self.conn.send(b"PONG\r\n")
            return None
        if line.startswith("-ERR"):
            if "Permissions Violation" in line:
                raise Failed(f"NATS refused: {line[5:].strip(chr(39))}", EXIT_REFUSED)
            raise ConnectionError(line)
        if data is None:
            return None  # +OK, PONG, INFO
        fields = line.split()
        sid = fields[2]
        has_reply = len(fields) == (6 if fields[0] == "HMSG" else 5)
        if fields[0] == "HMSG":
            headers = int(fields[-2])
            if data[:headers].split(b"\r\n", 1)[0].split()[1:2] == [b"503"]:
                self.no_responders = self.no_responders or sid == _REPLIES
                return None
            data = data[headers:]
        if sid == _REPLIES:
            reply = json.loads(data)
            if self.job is None:
                refuse_error(reply)  # the submission refused
            elif reply.get("ok") is False:
                return None  # (a cancel that came too late: the job's end is on its way)
            if self.job is None and "job" in reply:
                self.job = str(reply["job"])
            return None
        if sid == _STOPPING:
            reason = json.loads(data).get("reason", "")
            _say(f"CooRM is stopping: {reason}; job {self.job} is killed")
            return EXIT_UNREACHABLE
        if has_reply or not data:
            return None  # the batch service asking whether this command still listens: it does
        return self._event(json.loads(data))

    def _event(self, ev: dict) -> int | None:
        kind = ev.get("event")
        if kind == "output":
            text = ev.get("data", "")
            if self.label:
                text = "".join(f"{ev.get('node')}: {line}\n" for line in text.splitlines())
            stream = self.sink or (sys.stdout if ev.get("stream") == "stdout" else sys.stderr)
            stream.write(text)
            stream.flush()
            return None
        if kind == "ended":
            return self._ended(ev.get("state"), ev.get("exit_code"), ev.get("reason", ""))
        return None

    def _ended(self, state: str | None, code: int | None, reason: str) -> int:
        if state == "completed":
            return 0
        if reason and reason != f"exit code {code}":
            _say(f"job {self.job} {state}: {reason}")
        return code if code else 1

    # -- a lost connection ----------------------------------------------------------------------------
    def _reconnect(self) -> int | None:
        """Connect again within the reconnect window, listen again, and ask the queue what became of the
        job meanwhile: its exit code if it ended, else None (go on listening)."""
        from coorm.shared import subjects

        self.conn.sock.close()
        give_up = time.monotonic() + RECONNECT_WINDOW
        while True:
            try:
                self.conn = connect(self.client, self.where)
                break
            except Failed as e:
                if e.code != EXIT_UNREACHABLE or time.monotonic() > give_up:
                    _say(f"lost CooRM at {self.where}; job {self.job} may still run: see 'coorm queue'")
                    return EXIT_UNREACHABLE
                time.sleep(0.5)
        self._listen()
        self.conn.sock.settimeout(10.0)
        history = f"{self.conn.inbox}.{os.urandom(8).hex()}"
        self.conn.send(f"SUB {history} 4\r\n".encode())
        self._publish(subjects.BATCH_QUERY, {"jobs": [self.job], "ended": True}, history)
        self.heard = time.monotonic()
        while True:  # (events may come first: they are acted on)
            try:
                line, data = self.conn.frame()
            except TimeoutError:  # no answer: its end will come as an event, or not at all (asked again)
                self.conn.sock.settimeout(0.5)
                return None
            except (OSError, ValueError):
                return self._reconnect()
            fields = line.split()
            if data is not None and fields[2] == "4":
                if fields[0] == "HMSG":
                    data = data[int(fields[-2]):]
                jobs = json.loads(data).get("jobs") if data else None
                self.conn.sock.settimeout(0.5)
                if jobs:
                    return self._ended(jobs[0]["state"], jobs[0].get("exit_code"), jobs[0].get("reason", ""))
                return None
            code = self._handle(line, data)
            if code is not None:
                return code


def _say(text: str) -> None:
    sys.stderr.write(f"coorm: {text}\n")
    sys.stderr.flush()
