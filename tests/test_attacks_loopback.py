"""A malicious central node against flower-vfl's own ClientApp, through a real SuperLink and
SuperNodes (slow): the attacks of issue 20 that need a process boundary — new runs, restarts,
another ``num-parties``, forged PSI orders — each refused with an error naming the cause or
accounted in the party's one ledger on its own disk (its ε asserted against the accountant).
A private party reserves a run's whole plan when it admits the run (at identify): a run whose
plan does not fit beside an open reservation is refused before any release, naming the run that
holds it (``BudgetReserved``), and once the reservation lapsed (the party's ``dp-plan-expiry``) a
plan that does not fit in what the releases made left is refused too (``PlanUnaffordable``).

The ServerApp is ``tests/apps/malicious/malicious_server.py``: submitted with ``flwr run`` like
any app, it asks the party for training releases with q = y = 0 under whatever run config the
attacker chooses (and a ``plan.json`` of its own in its out-dir: PSI with forged orders, a pause
while the test kills the party's SuperNode). Every process is started in its own session and
stopped (or killed) by process group. The SuperNodes run as ``flower-vfl deploy-local`` runs
them (Flower's SuperNode with a 0.2 s idle poll, ClientApps forked by the warm executor).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flower_vfl.deploy.local import (Processes, any_alive, free_port, loopback_env, start_supernode, submit,
                                     wait_run, write_connection)
from flower_vfl.privacy.accounting import epsilon_for_events, noise_multiplier_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")]
APP = Path(__file__).resolve().parent / "apps" / "malicious"
DELTA = 1e-5
#: the party's SuperNode announces a heartbeat every 10 s (Flower: 30): a killed node's old
#: session is gone from the SuperLink ~20 s after its last heartbeat, not ~60 s
HEARTBEAT_S = 10


class Link:
    """One insecure loopback SuperLink, SuperNodes started (and killed) by name, ``flwr run``s."""

    def __init__(self, tmp):
        self.tmp, self.port = tmp, free_port()
        self.env = loopback_env(tmp / "flwr_home")
        self.conn = write_connection(tmp / "flwr_home", "loopback", f"127.0.0.1:{self.port}")
        self.procs = Processes(tmp / "logs")
        self.procs.start("superlink", ["flower-superlink", "--insecure", "--port", self.port,
                                       "--disable-runtime-dependency-installation"], self.env, tmp)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            time.sleep(0.2)
        self.nodes = {}

    def node(self, name, node_config):
        """A SuperNode (``--isolation process``, 0.2 s idle poll) and its warm executor (the
        accountants' libraries imported before it forks: a private party's reply reports ε by
        every accountant, ~3-8 s of imports in each forked ClientApp otherwise): two process groups."""
        self.nodes[name] = node_config
        start_supernode(self.procs, name, f"127.0.0.1:{self.port}", node_config, self.env, self.tmp,
                        idle_poll=0.2, accountants="eager", heartbeat=HEARTBEAT_S)

    def kill(self, name):
        """SIGKILL the node's process groups (the SuperNode, its executor and any ClientApp)."""
        for n in (name, f"{name}-exec"):
            self.procs.stop(n, sig=signal.SIGKILL, timeout=10.0)

    def restart(self, name):
        self.kill(name)
        self.node(name, self.nodes[name])

    def attack(self, name, rc, plan=None, during=None):
        """One ``flwr run`` of the malicious app; ``during(out_dir)`` runs while it does."""
        out = self.tmp / name
        out.mkdir()
        if plan is not None:
            (out / "plan.json").write_text(json.dumps(plan))
        run = submit(APP, self.conn, f'{rc} out-dir="{out}"', self.env)
        if during is not None:
            during(out)
        rec = wait_run(run, self.conn, self.env, self.tmp / "logs" / f"{name}.log", timeout=600, poll=0.5)
        assert rec["status"] == "finished:completed", rec
        log = json.loads((out / "attack.json").read_text())
        print(name, "ServerApp steps (s):", log["times"])
        return log


def _trains(log):
    return [t for node in log["nodes"].values() for t in node["train"]]


def _releases(log):
    return [t for t in _trains(log) if "release_norm" in t]


def _refusals(log):
    return [t["refusal"] for t in _trains(log) if "refusal" in t]


def _ledger(state_dir) -> dict:
    """The party's ledger as its operator reads it: ``flower-vfl ledger --state-dir D --json``."""
    proc = subprocess.run([sys.executable, "-m", "flower_vfl.cli.commands", "ledger", "--state-dir", str(state_dir),
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _one_source(state_dir, releases, eps, planned):
    """The one source of the party's ledger holds ``releases`` releases, and its ε is the exact
    accountant's over that many releases at the plan's noise multiplier (and within ``eps``)."""
    led = _ledger(state_dir)
    assert len(led["sources"]) == 1, led
    src = led["sources"][0]
    z = noise_multiplier_for(eps, DELTA, planned, "exact")
    want = epsilon_for_events([("gaussian", z)] * releases, DELTA, "exact")
    assert src["releases"] == releases, src
    assert src["spent_epsilon"] == pytest.approx(want, rel=1e-9), src
    assert src["spent_epsilon"] <= eps * (1 + 1e-9), src
    assert led["journal"]["missing"] == 0 and led["journal"]["journaled"] == releases, led
    return src, z


def _identity(log):
    """The one identify reply of a run (a restarted node's, if the run had one)."""
    ident = [n["identify"]["identity"] for n in log["nodes"].values() if "identity" in n.get("identify", {})]
    return ident[-1]


def _reserved_by(run, holder, made, planned, plan):
    """The phrases of the party's BudgetReserved reason (ledger.Ledger.admit): ``run`` refused,
    the reservation held by the run ``holder`` with ``made`` of ``planned`` releases made."""
    return (f"refuses run {run}: its budget is reserved by run {holder} ({made} of {planned} planned releases made)",
            f"this run's plan of {plan} release(s) would bring it to ε=", "Wait for that run to end, or resume it",
            "dp-plan-expiry=86400 s")


def _unaffordable(run, plan, budget, spent, releases):
    """The phrases of the party's PlanUnaffordable reason: nothing reserved, too little left."""
    return (f"refuses run {run}: its plan of {plan} release(s) would bring its total to ε=",
            f"above the budget ε={budget:g}", f"already spent ε={spent:.4g} over {releases} release(s)")


def _refused_with(log, phrases, n):
    """``n`` training requests of the run, each refused with code 'budget' and every phrase."""
    assert _releases(log) == [], log
    refusals = _refusals(log)
    assert len(refusals) == n and all(r["code"] == "budget" for r in refusals), log
    for r in refusals:
        assert all(p in r["reason"] for p in phrases), (phrases, r)


def _plan_row(state_dir, plan):
    """The reservation of the plan opened by run ``plan``, as ``flower-vfl ledger --json`` lists it."""
    src, = _ledger(state_dir)["sources"]
    row, = (p for p in src["plans"] if p["plan"] == str(plan))
    return row


def test_another_num_parties_in_a_new_run_does_not_reset_the_budget(tmp_path):
    """The party plans 2 training + 1 evaluation release at ε = 1 (3 releases). Run A
    (num-parties=2) is admitted (its plan of 3 reserved) and takes 2 training releases, then its
    ServerApp ends without the model: its last release stays reserved. Run B (num-parties=3:
    another column block of the same people) finds that reservation in the same ledger: its
    identify and both its requests are refused naming run A (2 of 3 made); no release. Then the
    party's operator restarts it with dp-plan-expiry=1 s (run A is dead: its reservation lapses)
    and run C (num-parties=3 again) gets only what the 2 releases left: nothing, since its plan of
    3 does not fit; the refusal names what was spent. Run D presents run A's plan token (a resume,
    which reopens the lapsed plan) and asks for 3 rounds: it gets run A's 2 stored vectors again
    and a refusal past the plan's training releases. Never
    fresh releases: the ledger holds 2 and its ε is the accountant's over them (~60-150 s)."""
    state = tmp_path / "p0"
    nc = f'partition-id=0 dp=true dp-epsilon=1.0 dp-train-rounds=2 dp-eval-rounds=1 state-dir="{state}"'
    link = Link(tmp_path)
    try:
        link.node("party0", nc)
        a = link.attack("runA", 'dataset="breast_cancer" num-parties=2 max-rounds=2')
        b = link.attack("runB", 'dataset="breast_cancer" num-parties=3 max-rounds=2')
        held = _plan_row(state, a["run"])
        link.kill("party0")
        link.node("party0", nc + " dp-plan-expiry=1.0")
        # want_nodes: the killed node stays listed until its heartbeat expires; not waited for
        c = link.attack("runC", 'dataset="breast_cancer" num-parties=3 max-rounds=2', plan={"want_nodes": 1})
        # run D resumes run A (its token, as A's identify reply gave it) and asks for 3 rounds
        d = link.attack("runD", 'dataset="breast_cancer" num-parties=2 max-rounds=3',
                        plan={"want_nodes": 1, "resume_plans": {"0": _identity(a)["plan"]}})
    finally:
        link.procs.stop_all()
    ident = _identity(a)
    assert ident["affordable"] is True and ident["plan"].startswith(f"{a['run']}#"), ident
    assert (ident["plan_made"], ident["plan_size"], ident["continued"]) == (0, 3, False), ident
    assert [t["round"] for t in _releases(a)] == [0, 1], a
    # run B: refused at identify and at each request, naming run A's reservation
    phrases = _reserved_by(b["run"], a["run"], 2, 3, 3)
    ident = _identity(b)
    assert ident["affordable"] is False and all(p in ident["refused"] for p in phrases), ident
    assert "plan" not in ident, ident
    _refused_with(b, phrases, 2)
    assert (held["status"], held["made"], held["planned"], held["reserved"], held["runs"]) == \
        ("open", 2, 3, 1, [str(a["run"])]), held
    # run C: run A's reservation lapsed; what the 2 releases left cannot hold a plan of 3
    src, z = _one_source(state, 2, 1.0, 3)
    assert src["spent_epsilon"] < 1.0
    ident = _identity(c)
    assert ident["affordable"] is False and "refused" not in ident and "plan" not in ident, ident
    assert ident["spent_before_run"] == pytest.approx(src["spent_epsilon"], rel=1e-9), ident
    _refused_with(c, _unaffordable(c["run"], 3, 1.0, src["spent_epsilon"], 2), 2)
    assert [t["privacy"]["noise_multiplier"] for t in _releases(a)] == [pytest.approx(z)] * 2
    # run D: the token continues run A's plan, never a fresh one: rounds 0 and 1 get run A's stored
    # vectors (no new draw), round 2 is past the plan's 2 training releases
    ident = _identity(d)
    assert ident["affordable"] is True and ident["continued"] is True, ident
    assert (ident["plan"], ident["plan_made"], ident["plan_size"]) == (_identity(a)["plan"], 2, 3), ident
    assert [(t["round"], t["release_norm"]) for t in _releases(d)] == \
        [(t["round"], t["release_norm"]) for t in _releases(a)], d
    refusal, = _refusals(d)
    assert refusal["code"] == "plan" and "its plan allows 2 train release(s) per run" in refusal["reason"], refusal
    assert "2 were made in this run" in refusal["reason"], refusal
    assert src["runs"] == {str(a["run"]): {"train": 2, "eval": 0}}, src
    assert any_alive(link.procs.started) == []


def test_new_runs_and_restarts_spend_one_budget(tmp_path):
    """The party plans 3 training + 1 evaluation release at ε = 1 (4 releases). Its SuperNode is
    killed (SIGKILL, by process group) and restarted on the same state-dir between runs and in
    the middle of a run.

    Run 1 gets 2 (paused after round 1: the node is killed and restarted; the re-sent round 1
    gets the stored vector, not a new draw), then round 2: 3 releases; its ServerApp ends without
    the model, so its 4th release stays reserved. Run 2 (a restarted node, 2 requests) gets none:
    its identify and requests are refused naming run 1's reservation (3 of 4 made). Run 3 (the
    node restarted with dp-plan-expiry=1 s: run 1's reservation lapses) gets none either: its plan
    of 4 does not fit in what the 3 releases left, and the refusal names what was spent. The
    ledger's ε, read from the party's state-dir, is the accountant's over those 3 releases
    (~90-200 s)."""
    state = tmp_path / "p0"
    link = Link(tmp_path)
    nc = f'partition-id=0 dp=true dp-epsilon=1.0 dp-train-rounds=3 dp-eval-rounds=1 state-dir="{state}"'
    rc = 'dataset="breast_cancer" num-parties=2 max-rounds=3'

    def restart_when_paused(out):
        deadline = time.monotonic() + 300
        while not (out / "paused").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (out / "paused").exists()
        link.restart("party0")
        (out / "resume").write_text("")

    try:
        link.node("party0", nc)
        # want_nodes: the killed node stays listed until its heartbeat expires; not waited for
        r1 = link.attack("run1", rc, plan={"pause_after": 1, "want_nodes": 1}, during=restart_when_paused)
        link.restart("party0")
        r2 = link.attack("run2", rc.replace("max-rounds=3", "max-rounds=2"), plan={"want_nodes": 1})
        link.kill("party0")
        link.node("party0", nc + " dp-plan-expiry=1.0")
        r3 = link.attack("run3", rc.replace("max-rounds=3", "max-rounds=1"), plan={"want_nodes": 1})
    finally:
        link.procs.stop_all()
    # run 1: rounds 0, 1 on the first node; round 1 re-sent to the restarted node; round 2 there
    first, second = (r1["nodes"][n]["train"] for n in _first_then_restarted(r1))
    assert [t["round"] for t in first] == [0, 1] and all("release_norm" in t for t in first), r1
    assert [t["round"] for t in second] == [1, 2] and all("release_norm" in t for t in second), r1
    assert second[0]["release_norm"] == first[1]["release_norm"]          # the stored answer, no new draw
    assert second[1]["release_norm"] != first[1]["release_norm"]
    assert [e["round"] for e in second[1]["privacy"]["ledger"]["entries"]] == [0, 1, 2]
    restarted = r1["nodes"][r1["restarted_nodes"][0]]["identify"]["identity"]
    assert restarted["affordable"] is True and restarted["plan_made"] == 2, restarted    # the same plan, attached
    # run 2: run 1's reservation holds the 4th release
    phrases = _reserved_by(r2["run"], r1["run"], 3, 4, 4)
    ident = _identity(r2)
    assert ident["affordable"] is False and all(p in ident["refused"] for p in phrases), ident
    _refused_with(r2, phrases, 2)
    # run 3: the reservation lapsed; 3 releases spent leave too little for a plan of 4
    src, z = _one_source(state, 3, 1.0, 4)
    assert src["spent_epsilon"] < 1.0
    ident = _identity(r3)
    assert ident["affordable"] is False and "refused" not in ident, ident
    assert ident["spent_before_run"] == pytest.approx(src["spent_epsilon"], rel=1e-9), ident
    _refused_with(r3, _unaffordable(r3["run"], 4, 1.0, src["spent_epsilon"], 3), 1)
    assert src["runs"] == {str(r1["run"]): {"train": 3, "eval": 0}}, src
    plan, = src["plans"]
    assert (plan["plan"], plan["made"], plan["planned"]) == (str(r1["run"]), 3, 4), plan
    assert any_alive(link.procs.started) == []


def _first_then_restarted(log):
    restarted = log["restarted_nodes"]
    assert len(restarted) == 1 and len(log["nodes"]) == 2, log
    return [n for n in log["nodes"] if n not in restarted] + restarted


def _write_party_csv(path, ids, rng):
    lines = ["id,a,b,c"] + [f"{i},{rng.normal():.6f},{rng.normal():.6f},{rng.integers(0, 5)}" for i in ids]
    path.write_text("\n".join(lines) + "\n")


def test_forged_psi_orders_compose_in_one_ledger_and_psi_past_the_cap_is_refused(tmp_path):
    """A party's own file (40 IDs, shuffled), psi-max-asked=1.5 (one cap: 60 membership tests,
    all runs: distinct request items plus agreed-order IDs it does not hold). The label owner
    (malicious) holds 30 of the IDs and 10 it guessed.

    Run 1: PSI under its kept key, then the agreed order in a random permutation: the party
    aligns 30 rows and gives 2 training releases of its plan of 3; the ServerApp ends without the
    model, so the 3rd stays reserved. Run 2: the same request (nothing new), an order padded with
    the 10 guessed IDs (refused, the 10 counted as tests: 50), then the order one row short (29
    rows, another permutation): aligned, but another view of the same people is the same ledger:
    its identify and requests are refused naming run 1's reservation, no release. Run 3: a fresh
    PSI key makes all 40 items new (50 + 40 > 60): refused, naming psi-max-asked and both kinds of
    tests; nothing aligned, nothing released (~60-150 s)."""
    rng = np.random.default_rng(0)
    ids = [f"u{i:03d}" for i in rng.permutation(40)]
    data = tmp_path / "party1.csv"
    _write_party_csv(data, ids, rng)
    owner_ids = sorted(ids[:30]) + [f"g{i:03d}" for i in range(10)]
    key = os.urandom(32).hex()
    state = tmp_path / "p1"
    nc = (f'partition-id=1 data-path="{data}" id-column="id" state-dir="{state}" psi-max-asked=1.5 '
          f'dp=true dp-epsilon=2.0 dp-train-rounds=2 dp-eval-rounds=1')
    rc = 'num-parties=2 max-rounds=2'
    link = Link(tmp_path)
    try:
        link.node("party1", nc)
        r1 = link.attack("run1", rc, plan={"psi_ids": owner_ids, "psi_key": key, "psi_order": "permuted"})
        r2 = link.attack("run2", rc, plan={"psi_ids": owner_ids, "psi_key": key, "psi_order": ["padded", "short"]})
        r3 = link.attack("run3", rc, plan={"psi_ids": owner_ids, "psi_key": "fresh", "psi_order": "permuted"})
    finally:
        link.procs.stop_all()
    (n1,), (n2,), (n3,) = (list(r["nodes"].values()) for r in (r1, r2, r3))
    for node, n_rows in ((n1, 30), (n2, 29)):
        assert node["psi_common"] == 30, node
        sent = node["psi_order_sent"]
        assert sent != sorted(sent) and sent != [i for i in ids if i in set(sent)]    # nor the file's order
        assert node["psi_order"]["psi"]["n_rows"] == n_rows, node
        assert node["identify"]["identity"]["n_rows"] == n_rows, node
    assert n2["psi_order_sent"] != n1["psi_order_sent"][:29]
    padded = n2["psi_orders"][0]
    assert padded["form"] == "padded" and padded["n_sent"] == 40 and "psi" not in padded, padded
    assert "some ID(s) of the agreed order are not in this party's file" in padded["error"], padded
    assert [t["round"] for t in _releases(r1)] == [0, 1], r1
    ident = _identity(r1)
    assert ident["affordable"] is True and (ident["plan_made"], ident["plan_size"]) == (0, 3), ident
    # run 2: the reservation of run 1 holds its 3rd release, whatever rows and order run 2 aligned
    phrases = _reserved_by(r2["run"], r1["run"], 2, 3, 3)
    ident = _identity(r2)
    assert ident["affordable"] is False and all(p in ident["refused"] for p in phrases), ident
    _refused_with(r2, phrases, 2)
    # run 3: the request past the one cap is refused with the party's error naming the key
    err = n3["psi_answer"]["error"]
    for phrase in ("PSI bound: this request holds 40 items, 40 of them never asked before",
                   "the 50 membership tests already answered",
                   "(40 encrypted IDs in PSI requests, 10 IDs of agreed orders it does not hold)",
                   "cap of 60 (psi-max-asked=1.5 × its 40 IDs; one cap for PSI requests and agreed orders)"):
        assert phrase in err, (phrase, err)
    assert "psi_order" not in n3 and _trains(r3) == [], r3
    src, z = _one_source(state, 2, 2.0, 3)
    assert src["spent_epsilon"] < 2.0
    assert src["source"] == {"kind": "files", "data-path": str(data.resolve()), "id-column": "id"}, src
    assert src["runs"] == {str(r1["run"]): {"train": 2, "eval": 0}}, src
    plan, = src["plans"]
    assert (plan["plan"], plan["status"], plan["made"], plan["reserved"]) == (str(r1["run"]), "open", 2, 1), plan
    psi = {r["kind"]: r for r in _ledger(state)["psi"]}
    assert psi["request"]["distinct_asked"] == 40 and psi["request"]["refused"] == 1, psi    # kept key: 40 once
    # only accepted orders name IDs (a refused order's IDs stay new): the 30 held; the 10 guessed are 'absent' tests
    assert psi["order"]["distinct_asked"] == 30 and psi["order"]["cap"] == 60, psi
    assert psi["absent"]["distinct_asked"] == 10 and psi["request"]["tests"] == 50, psi
    assert any_alive(link.procs.started) == []
