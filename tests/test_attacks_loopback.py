"""A malicious central node against flower-vfl's own ClientApp, through a real SuperLink and
SuperNodes (slow): the attacks of issue 20 that need a process boundary — new runs, restarts,
another ``num-parties``, forged PSI orders — each refused with an error naming the cause or
accounted in the party's one ledger on its own disk (its ε asserted against the accountant).

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


def test_another_num_parties_in_a_new_run_does_not_reset_the_budget(tmp_path):
    """The party plans 2 training + 1 evaluation release at ε = 1. Run A (num-parties=2) takes 2
    training releases. Run B (num-parties=3: another column block of the same people) must find
    them in the same ledger: 1 more release (the 3rd of the plan), then a refusal naming the
    budget; never 2 fresh ones. The ledger's ε is the accountant's over the 3 releases: ε = 1."""
    link = Link(tmp_path)
    try:
        link.node("party0", f'partition-id=0 dp=true dp-epsilon=1.0 dp-train-rounds=2 dp-eval-rounds=1 '
                            f'state-dir="{tmp_path / "p0"}"')
        a = link.attack("runA", 'dataset="breast_cancer" num-parties=2 max-rounds=2')
        b = link.attack("runB", 'dataset="breast_cancer" num-parties=3 max-rounds=2')
    finally:
        link.procs.stop_all()
    assert [t["round"] for t in _releases(a)] == [0, 1], a
    assert [t["round"] for t in _releases(b)] == [0], b
    refusal, = _refusals(b)
    assert refusal["code"] == "budget" and "above the budget ε=1" in refusal["reason"], refusal
    assert "already spent ε=1 over 3 release(s)" in refusal["reason"], refusal     # 2 of run A, 1 of run B
    src, z = _one_source(tmp_path / "p0", 3, 1.0, 3)
    assert src["spent_epsilon"] == pytest.approx(1.0, rel=1e-9)
    assert [t["privacy"]["noise_multiplier"] for t in _releases(a) + _releases(b)] == [pytest.approx(z)] * 3
    assert src["runs"] == {str(a["run"]): {"train": 2, "eval": 0}, str(b["run"]): {"train": 1, "eval": 0}}
    assert any_alive(link.procs.started) == []


def test_new_runs_and_restarts_spend_one_budget(tmp_path):
    """The party plans 3 training + 1 evaluation release at ε = 1 (4 releases). Its SuperNode is
    killed (SIGKILL, by process group) and restarted on the same state-dir between runs and in
    the middle of a run.

    Run 1 gets 2 (paused after round 1: the node is killed and restarted; the re-sent round 1
    gets the stored vector, not a new draw), then round 2: 3 releases. Run 2 (a restarted node,
    2 requests) gets 1 more (the 4th: ε = 1 exactly), then a refusal naming the budget. Run 3
    (restarted again) gets none: its identify reports the plan unaffordable and its request is
    refused. The ledger's ε, read from the party's state-dir, is the accountant's over those 4
    releases."""
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
        link.restart("party0")
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
    # run 2: the 4th release, then the budget; run 3: nothing
    assert [t["round"] for t in _releases(r2)] == [0], r2
    assert [r["code"] for r in _refusals(r2)] == ["budget"], r2
    ident, = (n["identify"]["identity"] for n in r3["nodes"].values() if "identity" in n.get("identify", {}))
    assert ident["affordable"] is False and ident["spent_before_run"] == pytest.approx(1.0, rel=1e-9), ident
    assert _releases(r3) == [] and [r["code"] for r in _refusals(r3)] == ["budget"], r3
    assert all("already spent ε=1 over 4 release(s)" in r["reason"] for r in _refusals(r3)), r3
    src, z = _one_source(state, 4, 1.0, 4)
    assert src["spent_epsilon"] == pytest.approx(1.0, rel=1e-9)
    assert src["runs"] == {str(r1["run"]): {"train": 3, "eval": 0}, str(r2["run"]): {"train": 1, "eval": 0}}
    assert any_alive(link.procs.started) == []


def _first_then_restarted(log):
    restarted = log["restarted_nodes"]
    assert len(restarted) == 1 and len(log["nodes"]) == 2, log
    return [n for n in log["nodes"] if n not in restarted] + restarted


def _write_party_csv(path, ids, rng):
    lines = ["id,a,b,c"] + [f"{i},{rng.normal():.6f},{rng.normal():.6f},{rng.integers(0, 5)}" for i in ids]
    path.write_text("\n".join(lines) + "\n")


def test_forged_psi_orders_compose_in_one_ledger_and_psi_past_the_cap_is_refused(tmp_path):
    """A party's own file (40 IDs, shuffled), psi-max-asked=1.5 (cap: 60 distinct items of each
    kind, all runs). The label owner (malicious) holds 30 of the IDs and 10 it guessed.

    Run 1: PSI under its kept key, then the agreed order in a random permutation: the party
    aligns 30 rows and gives its 2 planned training releases. Run 2: the same request, then the
    order one row short (29 rows, another permutation): another view of the same people, so
    the same ledger: 1 release (the 3rd of the plan; ε = budget) and then a refusal naming the
    budget. Run 3: a fresh PSI key makes all 40 items new to the party's PSI log (40 + 40 > 60):
    refused, naming psi-max-asked; nothing aligned, nothing released."""
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
        r2 = link.attack("run2", rc, plan={"psi_ids": owner_ids, "psi_key": key, "psi_order": "short"})
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
    assert [t["round"] for t in _releases(r1)] == [0, 1], r1
    assert [t["round"] for t in _releases(r2)] == [0], r2
    refusal, = _refusals(r2)
    assert refusal["code"] == "budget" and "above the budget ε=2" in refusal["reason"], refusal
    # run 3: the request past the cap is refused with the party's error naming the key
    err = n3["psi_answer"]["error"]
    assert "PSI bound" in err and "psi-max-asked=1.5 × its 40 IDs" in err and "cap of 60" in err, err
    assert "psi_order" not in n3 and _trains(r3) == [], r3
    src, z = _one_source(state, 3, 2.0, 3)
    assert src["spent_epsilon"] == pytest.approx(2.0, rel=1e-9)
    assert src["source"] == {"kind": "files", "data-path": str(data.resolve()), "id-column": "id"}, src
    assert src["runs"] == {str(r1["run"]): {"train": 2, "eval": 0}, str(r2["run"]): {"train": 1, "eval": 0}}
    psi = {r["kind"]: r for r in _ledger(state)["psi"]}
    assert psi["request"]["distinct_asked"] == 40 and psi["request"]["refused"] == 1, psi    # kept key: 40 once
    assert psi["order"]["distinct_asked"] == 30 and psi["order"]["cap"] == 60, psi
    assert any_alive(link.procs.started) == []
