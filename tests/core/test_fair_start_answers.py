"""Fair-start holds end once every application they wait for has answered. The core finds the holds an
answer reaches from the time the application last answered, and counts the applications with waiting
requests rather than searching their requests: both searches were most of a command's time with thousands
of requests and holds (``benchmarks/bench_policy.py``'s event stream). Random runs are replayed here through
the plain way -- every hold looked at and copied, every request searched -- and must make the same
decisions, with the same holds, event by event."""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from coorm.services.policy_engine.core import PolicyCore
from coorm.services.policy_engine.state import Hold, RequestState
from tests.core.test_properties import Driver, _dump, explain, settings_st, sizes_st, steps_st

WAITING = RequestState.WAITING


def _answered_plainly(core: PolicyCore, app_id: str, *, left: bool = False) -> None:
    if not any(app_id in h.awaiting and (left or core.now > h.begin) for h in core.holds):
        return
    kept = []
    for h in core.holds:
        if app_id in h.awaiting and (left or core.now > h.begin):
            h = Hold(h.cluster, h.begin, h.until, h.nodes, h.physical, h.request, h.awaiting - {app_id})
            if not h.awaiting:
                core._tell(h.request, "fair-start hold ended", "every waiting application answered")
                if h.physical:
                    core.released_holds.append(h)
                continue
        kept.append(h)
    core.holds = kept
    core.dirty = True


def _holds(core: PolicyCore) -> list[tuple]:
    return [(h.cluster, h.begin, h.until, h.nodes, h.physical, h.request, sorted(h.awaiting)) for h in core.holds]


class _Recording(Driver):
    def feed(self, ev, pass_now: bool | None = None) -> list:
        out = super().feed(ev, pass_now)
        self.holds_after = [*getattr(self, "holds_after", []), _holds(self.cores.policy)]
        return out


def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core as it was: every application's requests searched for a waiting one at each ``done``, every
    hold looked at (and copied) at each answer."""
    counted = PolicyCore._hold_on_done

    def hold_on_done(core: PolicyCore, r) -> None:
        before = len(core.holds)
        counted(core, r)
        searched = {a.id for a in core.apps.values()
                    if a.adapts and any(q.state is WAITING and q.id != r.id for q in a.requests.values())}
        for h in core.holds[before:]:
            assert h.awaiting == searched, f"done of {r.id}: awaits {sorted(h.awaiting)}, not {sorted(searched)}"

    monkeypatch.setattr(PolicyCore, "_hold_on_done", hold_on_done)
    monkeypatch.setattr(PolicyCore, "_answered", _answered_plainly)


# runs rich in holds: fair-start on, several applications, more of the work that makes and answers holds
# (requests that start and end early while others wait)
_HOLDING = {"submit": (6, Driver.op_submit), "done": (6, Driver.op_done), "cancel": (2, Driver.op_cancel),
            "tick": (3, Driver.op_tick)}


_FAIR_START_ON = settings_st.map(lambda s: s.model_copy(update={"fair_start": s.fair_start or 2.0}))


@given(data=st.data(), settings=_FAIR_START_ON, sizes=sizes_st, steps=steps_st(10, 45))
def test_holds_end_as_when_every_hold_is_looked_at(data, settings, sizes, steps):
    drv = _Recording(data, settings, sizes, apps=data.draw(st.integers(2, 4)), defer=data.draw(st.booleans()))
    with explain(settings, drv):
        drv.run(steps, extra=_HOLDING)
    with pytest.MonkeyPatch.context() as mp:
        _plain(mp)
        again = _Recording.replay(drv.events, settings, drv.passes_now)
    assert _dump(again.outs) == _dump(drv.outs)
    assert again.holds_after == drv.holds_after
    ended = sum(1 for stories in drv.cores.policy.stories.values() for _, what, _ in stories
                if what == "fair-start hold ended")
    event(f"holds ended by answers: {min(ended, 3)}{'+' if ended >= 3 else ''}")
    event(f"holds at some point: {max(map(len, drv.holds_after), default=0) > 0}")
