"""``flower-vfl ledger`` shows the plans a private party reserved (run, status, releases made of
planned, ε planned and spent, when the reservation lapses) and ``--release-plan RUN`` gives up a
stuck one: through the real ClientApp handlers (a run that crashed after its identify and its first
private release), the printed lines asserted, then a second run admitted once it is released."""

import re

import pytest

from flower_vfl.cli import main
from flower_vfl.privacy.accounting import epsilon_for_events
from test_failure_budget import DELTA, ADMM_RC, Crash, admm_nodes, admm_run, counted_noise, ledger, spent  # noqa: F401


def _lines(capsys):
    out = capsys.readouterr().out
    # the clock's stamps vary: replaced by a placeholder
    return [re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "<time>", line) for line in out.splitlines()]


def test_ledger_shows_a_stuck_reservation_and_releases_it(tmp_path, capsys, counted_noise):
    ncs = admm_nodes(tmp_path)
    rc = {**ADMM_RC, "state-dir": str(tmp_path / "server")}
    # messages: 2 identify, 4 warm-start rounds and an evaluation of party 0, then round 5 to party 0
    # and party 1 (its first private release): the ServerApp dies right after that 9th message
    with pytest.raises(Crash):
        admm_run(ncs, rc, run_id=1, crash_after=9)
    assert [e[1:3] for e in ledger(ncs[101], rc)] == [(5, "train")]
    state = ncs[101]["state-dir"]
    # the references: the accountant over the one release charged, and over the plan's 3 releases at its z
    (z,) = {e[3] for e in ledger(ncs[101], rc)}
    made, planned = spent(ncs[101], rc), epsilon_for_events([("gaussian", z)] * 3, DELTA, "exact")
    assert planned == pytest.approx(4.0, rel=1e-9)            # the plan is calibrated to the budget
    assert main(["ledger", "--state-dir", state]) == 0
    lines = _lines(capsys)
    assert lines == [
        f"party store {state}/party.sqlite",
        f"  bundled breast_cancer (scikit-learn), partition 1, party 1: budget ε=4.0 δ=1e-05 (exact); 1 releases "
        f"over 1 run(s); spent ε={made:.4g}, left ε={4.0 - made:.4g}",
        "    run 1: 1 training, 0 model release(s)",
        f"    plan run 1 (runs 1): open; 1 of 3 release(s) made, 2 reserved; ε={planned:.4g} planned, "
        f"ε={made:.4g} spent; last activity <time>, lapses <time> (dp-plan-expiry=86400 s); release it now: "
        f"flower-vfl ledger --state-dir {state} --release-plan 1"]
    # its operator releases it (a run that will not be resumed): the made release stays charged
    assert main(["ledger", "--state-dir", state, "--release-plan", "1"]) == 0
    assert _lines(capsys) == [
        "flower-vfl ledger: released the reservation of plan run 1 on bundled breast_cancer (scikit-learn), "
        f"partition 1: its 1 made release(s) (ε={made:.4g}) stay charged, its 2 unmade one(s) are no longer reserved"]
    assert main(["ledger", "--state-dir", state, "--release-plan", "1"]) == 2
    assert capsys.readouterr().err == (f"flower-vfl ledger: no open plan of run '1' at {state}; `flower-vfl ledger "
                                       f"--state-dir {state}` lists the plans\n")
    assert main(["ledger", "--state-dir", state, "--node-config", "dp-plan-expiry=60"]) == 0
    assert _lines(capsys)[3] == (
        f"    plan run 1 (runs 1): released; 1 of 3 release(s) made, 0 reserved; ε={planned:.4g} planned, "
        f"ε={made:.4g} spent; last activity <time>")
    from flower_vfl.privacy.store import party_store
    from flower_vfl.clients.source import declared_source
    src = declared_source(ncs[101], rc, 1).key
    assert party_store(state).reserved_events(src) == [] and spent(ncs[101], rc) == made


def test_a_lapse_stands_when_the_new_plan_is_refused(tmp_path, capsys, monkeypatch):
    """Plan of run 7 (3 releases, 1 made) idles past dp-plan-expiry; a new plan of run 8 that the
    budget cannot afford is refused by name, and the ledger (store and ``flower-vfl ledger``) lists
    plan 7 as 'lapsed' with nothing reserved: the refusal's rollback no longer undoes the lapse.
    The clock is the store's, moved by hand (no sleeping)."""
    import types

    from flower_vfl.privacy import store as store_mod
    from flower_vfl.privacy.ledger import Budget, BudgetReserved, Ledger, PlanUnaffordable
    from flower_vfl.privacy.store import PartyStore

    clock = [1_700_000_000.0]
    monkeypatch.setattr(store_mod, "time", types.SimpleNamespace(
        time=lambda: clock[0], monotonic=store_mod.time.monotonic, sleep=store_mod.time.sleep,
        strftime=store_mod.time.strftime))
    store = PartyStore(tmp_path)
    led = Ledger(store, "src", Budget(1.0, 1e-5), party_id=1)
    z, expiry = 10.0, 60.0
    plan, how = led.admit("7", train=2, eval=1, noise_multiplier=z, expiry=expiry)
    assert (how, plan.status, plan.reserved_events()) == ("new", "open", [("gaussian", z)] * 3)
    led.commit("7", 1, "train", "h", unit="column", noise_multiplier=z, sigma=z, sensitivity=1.0, payload={})
    made = epsilon_for_events([("gaussian", z)], 1e-5, "exact")
    assert led.spent() == pytest.approx(made, rel=1e-12)

    # within the expiry, run 8's plan of 10 is refused because run 7's reservation holds: nothing changes
    clock[0] += 10.0
    with pytest.raises(BudgetReserved, match=r"its budget is reserved by run 7 \(1 of 3 planned releases made\)"):
        led.admit("8", train=10, eval=0, noise_multiplier=z, expiry=expiry)
    assert [(p.plan, p.status) for p in store.plans("src")] == [("7", "open")]
    assert store.reserved_events("src") == [("gaussian", z)] * 2

    # past it, run 7 lapses; run 8's plan still does not fit beside the one release made: refused
    clock[0] += 100.0
    after = epsilon_for_events([("gaussian", z)] * 11, 1e-5, "exact")
    with pytest.raises(PlanUnaffordable) as refused:
        led.admit("8", train=10, eval=0, noise_multiplier=z, expiry=expiry)
    assert str(refused.value) == (
        f"party 1 refuses run 8: its plan of 10 release(s) would bring its total to ε={after:.4g}, above the budget "
        f"ε=1 (δ=1e-05, method='exact'); already spent ε={made:.4g} over 1 release(s)")
    # the lapse is durable: a fresh connection (another process) sees it, nothing is reserved, run 8 has no plan
    again = PartyStore(tmp_path)
    for s in (store, again):
        assert [(p.plan, p.status, p.made) for p in s.plans("src")] == [("7", "lapsed", 1)]
        assert s.reserved_events("src") == [] and s.plan_of("src", "8") is None
        assert [(e.run, e.round, e.kind) for e in s.entries("src")] == [("7", 1, "train")]
    again.close()
    planned = epsilon_for_events([("gaussian", z)] * 3, 1e-5, "exact")
    assert main(["ledger", "--state-dir", str(tmp_path)]) == 0
    assert _lines(capsys) == [
        f"party store {tmp_path}/party.sqlite",
        f"  src, party 1: budget ε=1.0 δ=1e-05 (exact); 1 releases over 1 run(s); spent ε={made:.4g}, "
        f"left ε={1.0 - made:.4g}",
        "    run 7: 1 training, 0 model release(s)",
        f"    plan run 7 (runs 7): lapsed; 1 of 3 release(s) made, 0 reserved; ε={planned:.4g} planned, "
        f"ε={made:.4g} spent; last activity <time>"]
    # a plan that fits beside the made release is admitted on the budget the lapse gave back
    plan, how = led.admit("9", train=3, eval=0, noise_multiplier=z, expiry=expiry)
    assert (how, plan.status) == ("new", "open")
    assert store.reserved_events("src") == [("gaussian", z)] * 3
    assert [(p.plan, p.status) for p in store.plans("src")] == [("7", "lapsed"), ("9", "open")]


def test_a_lapsed_plan_is_resumed_only_if_its_unmade_releases_fit_again(tmp_path, monkeypatch):
    """A lapsed plan gave up its reservation; a resume that names its token (the server holds it)
    must not reopen it when another plan took that budget since: its resume would stop part-way,
    its releases spent without a model. It reopens when its unmade releases fit again."""
    import types

    from flower_vfl.privacy import store as store_mod
    from flower_vfl.privacy.ledger import Budget, BudgetReserved, Ledger
    from flower_vfl.privacy.store import PartyStore

    clock = [1_700_000_000.0]
    monkeypatch.setattr(store_mod, "time", types.SimpleNamespace(
        time=lambda: clock[0], monotonic=store_mod.time.monotonic, sleep=store_mod.time.sleep,
        strftime=store_mod.time.strftime))
    store = PartyStore(tmp_path)
    budget = Budget(1.0, 1e-5)
    led = Ledger(store, "src", budget, party_id=1)
    z, expiry = 10.0, 60.0
    # how many releases at z the budget affords (the accountant's own figure, not a constant)
    fits = max(k for k in range(1, 400) if epsilon_for_events([("gaussian", z)] * k, 1e-5, "exact") <= 1.0)
    plan7, _ = led.admit("7", train=fits - 1, eval=1, noise_multiplier=z, expiry=expiry)
    led.commit("7", 1, "train", "h", unit="column", noise_multiplier=z, sigma=z, sensitivity=1.0, payload={})
    clock[0] += 100.0                        # plan 7 lapses; run 8 takes all the budget left
    plan8, how8 = led.admit("8", train=fits - 1, eval=0, noise_multiplier=z, expiry=expiry)
    assert how8 == "new" and [(p.plan, p.status) for p in store.plans("src")] == [("7", "lapsed"), ("8", "open")]

    held = epsilon_for_events([("gaussian", z)] * fits, 1e-5, "exact")
    after = epsilon_for_events([("gaussian", z)] * (2 * fits - 1), 1e-5, "exact")
    made = epsilon_for_events([("gaussian", z)], 1e-5, "exact")
    with pytest.raises(BudgetReserved) as refused:
        led.admit("9", train=fits - 1, eval=1, noise_multiplier=z, token=plan7.token, expiry=expiry)
    assert str(refused.value) == (
        f"party 1 refuses run 9: its budget is reserved by run 8 (0 of {fits - 1} planned releases made). With "
        f"that reservation ε={held:.4g} of its budget ε=1 is taken (δ=1e-05, method='exact'; spent ε={made:.4g}), "
        f"and the lapsed plan of run 7 it resumes (1 of {fits} planned releases made, {fits - 1} left; its "
        f"reservation was given up when it lapsed) would bring it to ε={after:.4g}. Wait for that run to end, or "
        "resume it (resume='<its state-dir>'); a reservation whose run made no release (nor a first resume since) for "
        "dp-plan-expiry=60 s (the party's node config) lapses")
    # nothing of the refused resume is written: plan 7 stays lapsed, run 9 has no plan
    assert [(p.plan, p.status) for p in store.plans("src")] == [("7", "lapsed"), ("8", "open")]
    assert store.plan_of("src", "9") is None

    # once plan 8 is released by the operator, the same resume reopens plan 7 with its releases made
    assert store.release_plan("src", plan8.plan)
    plan, how = led.admit("9", train=fits - 1, eval=1, noise_multiplier=z, token=plan7.token, expiry=expiry)
    assert (how, plan.plan, plan.status, plan.made) == ("continued", "7", "open", 1)
    assert store.reserved_events("src") == [("gaussian", z)] * (fits - 1)
