"""The policy engine leader's lease, renewed from a thread of its own.

Renewed by a task of the engine's event loop, the renewal waited behind whatever the loop had queued. With
5,000 sessions submitting within a second, it came more than a lease late: the lease lapsed, the standby took
over, replayed the log under the same load and lost the lease in turn, and the two engines took turns --
serving nothing, 13 to 21 times in a minute -- for as long as the load lasted (docs/scale.md, "5,000
sessions: the burst and the throughput"). A thread renews it on time whatever the loop has queued (the GIL is
handed over every few milliseconds), as long as the loop shows it still runs: a loop that has not ticked for
:data:`LOOP_STALL` leases is wedged, and its lease is let lapse so that the standby takes over.

The term ends as before: at the first renewal refused (another holds the lease), failed, or answered after
the lease could have lapsed -- it runs from when the last renewal was sent, so a renewal left unanswered
(a Valkey primary gone, its connections hanging) ends the term within the lease, not at the socket's
timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from redis.exceptions import RedisError

from coorm.shared import valkey

# renew a lease still held by this instance (KEYS: the lease; ARGV: the instance, the lease in ms)
RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
LOOP_STALL = 10  # leases without a tick from the event loop: it is wedged, and the lease is let lapse


class LeaseKeeper:
    """Renews ``key`` (held by ``instance`` since ``taken``, a ``time.monotonic()``) every third of ``lease``
    seconds from a thread, while the event loop ticks (:meth:`tick`); sets ``lost`` (in ``loop``) when the term
    must end, with :attr:`why`. :meth:`stop` ends the thread without setting it."""

    def __init__(self, url: str, key: str, instance: str, lease: float, taken: float,
                 loop: asyncio.AbstractEventLoop, lost: asyncio.Event) -> None:
        self.url, self.key, self.instance, self.lease, self.taken = url, key, instance, lease, taken
        self.loop, self.lost = loop, lost
        self.why = ""
        self.ticked = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{instance}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def tick(self) -> None:
        """The event loop runs."""
        self.ticked = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        lease, ms = self.lease, int(self.lease * 1000)
        # (a renewal unanswered within half a lease fails: sent on time, that is before the lease could lapse)
        client = valkey.sync_client(self.url, socket_timeout=lease / 2, socket_connect_timeout=lease / 2)
        valid_until = self.taken + lease
        why = ""
        try:
            while not self._stop.wait(lease / 3):
                if time.monotonic() - self.ticked > LOOP_STALL * lease:
                    why = f"the event loop has not run for {LOOP_STALL} leases: lease let lapse"
                    break
                sent = time.monotonic()
                try:
                    renewed = client.eval(RENEW, 1, self.key, self.instance, ms)
                except (RedisError, OSError) as e:
                    why = f"lease not renewed ({e!r})"
                    break
                if time.monotonic() > valid_until:
                    why = "lease not renewed before it could lapse"
                    break
                if not renewed:
                    why = "lease lost"
                    break
                valid_until = sent + lease
        finally:
            with contextlib.suppress(Exception):
                client.close()
        if self._stop.is_set():
            return
        self.why = why
        with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile: nobody to tell)
            self.loop.call_soon_threadsafe(self.lost.set)
