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
