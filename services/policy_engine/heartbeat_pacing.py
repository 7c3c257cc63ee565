"""How often sessions say they are alive: the pace of heartbeats (a pure core: time passed in).

Every open session sends a heartbeat each ``heartbeat_interval``; with thousands of sessions that is most of
what the policy engine, nats-server and the launchers do while nothing else happens (5,000 sessions beating
every 2 s: 2,500 heartbeats a second). So the engine holds heartbeats to a *rate*: past ``rate`` a second
over all sessions, it tells every session to beat half as often, then a quarter..., up to ``longest``
seconds between beats; the session timeout grows with the interval (a session is reaped after the same
number of missed beats). The interval is the base period times a power of two, the *level*.

A session learns the interval at its opening and from each heartbeat's answer (a session that asked to be
paced, ``SessionOpen.paced``), so it follows a change one beat late. Hence:

* the level rises at once (sessions still beating at the shorter interval only beat more often than they
  need), and falls one step at a time, only once every session has beaten since the last change -- so a
  session never follows a level more than one above the current one;
* a silent session is reaped after the timeout of the highest level a session may still follow
  (:meth:`HeartbeatPace.reaping_timeout`), not the current one: a session told the longer interval just
  before a fall is not reaped for beating at it.

A new leader starts at the highest level its predecessor stored (:meth:`HeartbeatPace.taken_over`): it
cannot know which sessions heard of a fall."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HeartbeatPace:
    base: float = 2.0  # seconds between beats while under the rate (launcher_heartbeat)
    timeout: float = 10.0  # a session silent this long at the base interval is reaped (session_timeout)
    rate: float = 1000.0  # heartbeats a second over all sessions, at most (while under ``longest``)
    longest: float = 30.0  # seconds between beats, at most
    level: int = 0  # the interval is base * 2**level
    previous: int = 0  # the level before the last change
    changed_at: float = float("-inf")

    def interval(self, level: int | None = None) -> float:
        return self.base * 2 ** (self.level if level is None else level)

    def session_timeout(self, level: int | None = None) -> float:
        return self.timeout * 2 ** (self.level if level is None else level)

    def wanted(self, sessions: int) -> int:
        """The lowest level at which ``sessions`` beat within the rate, or the highest under ``longest``."""
        level = 0
        while sessions > self.rate * self.interval(level) and self.interval(level + 1) <= self.longest:
            level += 1
        return level

    def _settled(self, now: float) -> bool:
        """Whether every session has beaten since the last change (each was told the new interval)."""
        return now - self.changed_at >= self.interval(max(self.level, self.previous))

    def update(self, sessions: int, now: float) -> bool:
        """Follow the number of open sessions at ``now``; whether the level changed."""
        wanted = self.wanted(sessions)
        if wanted > self.level:
            self.previous, self.level, self.changed_at = self.level, wanted, now
            return True
        if wanted < self.level and self._settled(now):
            self.previous, self.level, self.changed_at = self.level, self.level - 1, now
            return True
        return False

    def followed(self, now: float) -> int:
        """The highest level a session may still be following at ``now``."""
        return self.level if self._settled(now) else max(self.level, self.previous)

    def reaping_timeout(self, now: float) -> float:
        return self.session_timeout(self.followed(now))

    def taken_over(self, level: int, now: float) -> None:
        """A new leader, whose predecessor's sessions may follow up to ``level`` (what it stored)."""
        self.level = self.previous = max(0, level)
        self.changed_at = now
