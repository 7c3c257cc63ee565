"""The simulator's model of the live system's delays (:class:`coorm.simulator.delays.Delays`): off, it is the
papers' instant RMS, bit for bit; on, each delay moves what it should by what it should -- worked out by
hand on one or two applications on an idle cluster."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coorm.launchers.moldable import MoldableLauncher
from coorm.launchers.psa import PSALauncher
from coorm.launchers.rigid import RigidLauncher
from coorm.services.policy_engine.core import PolicySettings
from coorm.simulator.delays import Delays
from coorm.simulator.engine import Simulation

# passes at once (no fair-start hold, a burst of passes allowed): a start is decided when its request arrives
QUIET = PolicySettings(fair_start=0.0, reschedule_interval=1.0, pass_burst=16)


def one_rigid(delays: Delays | None, *, process_work: bool = False, at: float = 10.0):
    sim = Simulation({"c0": 4}, QUIET, delays=delays)
    sim.add(at, RigidLauncher("r", "c0", 2, 100.0, runtime=5.0), process_work=process_work)
    return sim.run()


def mixed(delays: Delays | None):
    sim = Simulation({"c0": 8}, PolicySettings(fair_start=1.0, reschedule_interval=0.2, pass_burst=16),
                     delays=delays)
    sim.add(0.0, PSALauncher("psa", "c0", task_duration=3.0))
    sim.add(1.0, RigidLauncher("r1", "c0", 4, 30.0, runtime=4.0))
    sim.add(2.0, MoldableLauncher("m", "c0", [(2, 8.0), (4, 4.0), (8, 2.0)]))
    sim.add(2.5, RigidLauncher("r2", "c0", 6, 30.0, runtime=3.0))
    return sim.run()


def outline(result) -> list[tuple]:
    return [(a.name, a.started, a.ended, a.notifications, a.notification_bytes) for a in result.apps.values()] + [
        (r.request, r.nodes, r.start, r.end) for r in result.requests] + [(result.messages, result.bytes)]


def test_no_delays_is_the_instant_rms_of_the_papers():
    assert Delays().instant
    assert outline(mixed(None)) == outline(mixed(Delays()))
    r = one_rigid(None)
    assert r.apps["r"].started == r.apps["r"].heard_started == 10.0 and r.apps["r"].ended == 15.0


def test_a_command_reaches_the_rms_late_and_a_decision_reaches_the_launcher_late():
    r = one_rigid(Delays(command=0.3, notify=0.5))
    app = r.apps["r"]
    assert app.started == pytest.approx(10.3)  # its request reached the policy core
    assert app.heard_started == pytest.approx(10.8)  # ... whose start it heard of notify later
    assert app.ended == pytest.approx(15.8)  # its work (5 s) from when it heard, then it closed
    (req,) = r.requests
    assert req.end == pytest.approx(16.1)  # the RMS freed its nodes when its done arrived


def test_opening_a_session_delays_the_launchers_first_request():
    app = one_rigid(Delays(open=0.25, command=0.1)).apps["r"]
    assert app.started == pytest.approx(10.35)


def test_process_work_is_heard_to_end_exit_later_and_only_for_process_work():
    d = Delays(exit=0.4, launch=0.2)
    assert one_rigid(d, process_work=True).apps["r"].ended == pytest.approx(15.4)
    assert one_rigid(d, process_work=False).apps["r"].ended == pytest.approx(15.0)


def test_process_work_on_more_nodes_is_heard_to_end_later_by_exit_per_node():
    """The rigid job of one_rigid holds 2 nodes: its end is heard exit + 2 x exit_per_node after start + work
    (15 s), and that line times a drawn exit_factor when one is sampled."""
    d = Delays(exit=0.1, exit_per_node=0.15)
    assert one_rigid(d, process_work=True).apps["r"].ended == pytest.approx(15.4)
    drawn = replace(d, samples=(("exit_factor", (2.0,)),))
    assert one_rigid(drawn, process_work=True).apps["r"].ended == pytest.approx(15.8)
    assert one_rigid(replace(d, exit_per_node=0.0), process_work=True).apps["r"].ended == pytest.approx(15.1)


def test_process_work_started_with_others_is_heard_to_end_later_by_exit_per_launching():
    """Two rigid jobs started by the same pass: each hears of its end exit_per_launching x the other's nodes
    later (3 and 2); one started alone (exit_window after the others) is not delayed."""
    d = Delays(exit=0.1, exit_per_launching=0.5, exit_window=0.1)
    sim = Simulation({"c0": 8}, QUIET, delays=d)
    sim.add(1.0, RigidLauncher("a", "c0", 2, 100.0, runtime=5.0), process_work=True)
    sim.add(1.0, RigidLauncher("b", "c0", 3, 100.0, runtime=5.0), process_work=True)
    sim.add(1.5, RigidLauncher("c", "c0", 1, 100.0, runtime=5.0), process_work=True)
    r = sim.run()
    assert r.apps["a"].ended == pytest.approx(1.0 + 5.0 + 0.1 + 0.5 * 3)
    assert r.apps["b"].ended == pytest.approx(1.0 + 5.0 + 0.1 + 0.5 * 2)
    assert r.apps["c"].ended == pytest.approx(1.5 + 5.0 + 0.1)


def test_a_launcher_launching_hears_of_nothing_else_meanwhile():
    """A rigid job whose walltime (1 s) ends while it still launches on its 2 nodes (1 + 2 x 1 s): it hears
    of the end once the launch is over, as the live runner, which handles one input at a time."""
    sim = Simulation({"c0": 4}, QUIET, delays=Delays(launch=1.0, launch_per_node=1.0, notify=0.1))
    sim.add(0.0, RigidLauncher("r", "c0", 2, 1.0))
    r = sim.run()
    assert r.apps["r"].heard_started == pytest.approx(0.1)
    assert r.apps["r"].ended == pytest.approx(0.1 + 3.0)  # heard its end (at 1.1) only after launching


def test_a_launcher_sends_its_next_command_once_the_one_before_is_answered():
    """The rigid job of one_rigid ends its work at 15.8 s (heard its start at 10.8) and sends a done, then its
    close: with answers 0.4 s after a command is sent, the done reaches the RMS command later (its nodes
    freed then), and the close goes out once the done is answered -- when the application ends, as the live
    runner awaits each answer before its next command."""
    r = one_rigid(Delays(command=0.3, notify=0.5, reply=0.4))
    app = r.apps["r"]
    assert app.heard_started == pytest.approx(10.8)  # (its request answered at 10.4: before the start is heard)
    (req,) = r.requests
    assert req.end == pytest.approx(16.1)  # the done, sent at 15.8, applied command later
    assert app.ended == pytest.approx(15.8 + 0.4)  # the close, sent when the done was answered
    # without answers awaited (reply 0, the default), as before: the close goes out with the done
    assert one_rigid(Delays(command=0.3, notify=0.5)).apps["r"].ended == pytest.approx(15.8)


def test_a_launcher_awaiting_an_answer_hears_of_nothing_meanwhile():
    """Its request, sent at 10 s, is applied at 10.1 s and started at once; the start is told 0.05 s later,
    but the launcher awaits the request's answer until 11 s: it hears of its start then (the live runner
    handles one input at a time, and the answer first)."""
    r = one_rigid(Delays(command=0.1, notify=0.05, reply=1.0))
    assert r.apps["r"].started == pytest.approx(10.1)
    assert r.apps["r"].heard_started == pytest.approx(11.0)
    # an answer never comes before its command is applied: a reply shorter than the command is the command's
    assert one_rigid(Delays(command=0.1, notify=0.05, reply=0.01)).apps["r"].heard_started == pytest.approx(10.15)
    # the answers alone, commands applied as sent: started at once, heard once answered
    alone = one_rigid(Delays(reply=0.4)).apps["r"]
    assert (alone.started, alone.heard_started) == (pytest.approx(10.0), pytest.approx(10.4))


def test_views_paced_in_rounds_are_fewer_and_come_later():
    instant, paced = mixed(Delays(notify=1e-9)), mixed(Delays(notify=1e-9, view_period=2.0))
    psa_i, psa_p = instant.apps["psa"], paced.apps["psa"]
    assert psa_p.notifications < psa_i.notifications
    assert all(a.ended is not None for n, a in paced.apps.items() if n != "psa")


def test_live_views_counts_what_a_live_session_is_sent_and_changes_no_decision():
    base, live = Delays(notify=0.01, command=0.01), Delays(notify=0.01, command=0.01, live_views=True)
    a, b = mixed(base), mixed(live)
    assert [(r.request, r.start, r.end) for r in a.requests] == [(r.request, r.start, r.end) for r in b.requests]
    assert b.apps["m"].notifications > a.apps["m"].notifications  # the query on opening, views after start
    assert b.apps["r1"].notifications > a.apps["r1"].notifications


def test_a_launcher_follows_the_views_its_session_asks_for_on_opening():
    """Live, the SDK asks for its views within its opening, and its launcher has them as it starts to run:
    with opening_views a moldable application alone on its cluster chooses and is started as it opens; without
    (as before), it waits for a round's views -- here a second of view pacing and half a second of latency."""
    def moldable(opening: bool):
        sim = Simulation({"c0": 8}, QUIET, delays=Delays(open=0.05, command=0.01, notify=0.01, view_period=1.0,
                                                         view_notify=0.5, live_views=True, opening_views=opening))
        sim.add(3.0, MoldableLauncher("m", "c0", [(2, 8.0), (8, 2.0)]))
        return sim.run().apps["m"]

    followed, waited = moldable(True), moldable(False)
    assert followed.started == pytest.approx(3.06)  # opened at 3.05, its request reached the RMS 0.01 later
    assert waited.started >= 3.5  # a round's views, heard view_notify after it
    assert followed.notifications == waited.notifications  # the same views, followed or only counted


def test_negative_delays_are_refused():
    with pytest.raises(ValueError):
        Delays(notify=-1.0)


def test_a_scenario_file_may_model_the_delays(tmp_path):
    from coorm.simulator.run import simulate
    from coorm.simulator.scenario import load

    text = ("clusters: {c0: 4}\npolicy: {fair_start: 0, reschedule_interval: 1, pass_burst: 16}\n"
            "apps:\n  - {kind: rigid, at: 10, cluster: c0, nodes: 2, duration: 100, runtime: 5}\n")
    (tmp_path / "instant.yaml").write_text(text)
    (tmp_path / "delayed.yaml").write_text(text + "delays: {command: 0.3, notify: 0.5}\n")
    instant, _ = simulate(load(tmp_path / "instant.yaml"))
    delayed, _ = simulate(load(tmp_path / "delayed.yaml"))
    assert instant.apps["a1"].heard_started == pytest.approx(10.0)
    assert delayed.apps["a1"].heard_started == pytest.approx(10.8)
    (tmp_path / "answered.yaml").write_text(text + "delays: {command: 0.3, notify: 0.5, reply: 0.4}\n")
    answered, _ = simulate(load(tmp_path / "answered.yaml"))
    assert answered.apps["a1"].ended == pytest.approx(delayed.apps["a1"].ended + 0.4)  # its close after the answer
    (tmp_path / "bad.yaml").write_text(text + "delays: {notify: -1}\n")
    with pytest.raises(ValueError):
        load(tmp_path / "bad.yaml")


CONSTANT = Delays(notify=0.05, command=0.01, open=0.07, exit=0.2, launch=0.08, launch_per_node=0.02, view_period=0.1)


def test_sampled_delays_of_one_value_each_are_the_constants():
    one = tuple((name, (value,)) for name, value in
                (("notify", 0.05), ("command", 0.01), ("open", 0.07), ("exit", 0.2), ("launch_factor", 1.0)))
    assert outline(mixed(CONSTANT)) == outline(mixed(replace(CONSTANT, samples=one, seed=3)))


def test_sampled_delays_are_seeded_draws_from_the_live_samples():
    pools = (("notify", (0.01, 0.02, 0.6)), ("command", (0.002, 0.05)), ("open", (0.03, 0.4)),
             ("exit", (0.1, 0.5)), ("launch_factor", (0.5, 1.0, 3.0)))
    runs = [outline(mixed(replace(CONSTANT, samples=pools, seed=s))) for s in (1, 1, 2, 3)]
    assert runs[0] == runs[1]  # the same seed, the same run
    assert runs[0] != runs[2] or runs[0] != runs[3]
    r = one_rigid(replace(Delays(notify=0.5), samples=(("notify", (0.25, 0.75)),)))
    assert r.apps["r"].heard_started - r.apps["r"].started in (pytest.approx(0.25), pytest.approx(0.75))


def test_samples_must_name_a_delay_and_hold_values():
    with pytest.raises(ValueError):
        Delays(samples=(("views", (0.1,)),))
    with pytest.raises(ValueError):
        Delays(samples=(("notify", ()),))
    with pytest.raises(ValueError):
        Delays(samples=(("notify", (-0.1,)),))
