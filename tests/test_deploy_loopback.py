"""Real SuperLink + SuperNodes on loopback (slow): TLS with a generated CA and registered
SuperNode keys bound to parties, honest exit status, and faults (a SuperNode killed and
restarted, a party that never returns, the SuperLink and the ServerApp killed and the run
resumed). Every process is started in its own session and stopped by process group; the
tests check that none is left. breast_cancer keeps each round cheap; the SuperNodes run as
``deploy-local`` runs them (ClientApps forked by a warm executor, a 0.5 s idle poll)."""

import json
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from flower_vfl import VerticalADMM
from flower_vfl.io.data import labels, party_block
from flower_vfl.deploy.local import (Processes, any_alive, deploy_local, free_port, loopback_env, make_pki,
                                     start_supernode, submit, wait_run, write_connection)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")]
ROOT = Path(__file__).resolve().parents[1]
BC = {"dataset": "breast_cancer", "num-parties": 2}
#: the fault tests' SuperNodes announce a heartbeat every 10 s (Flower: 30): the SuperLink takes a
#: killed node for gone ~20 s after its last heartbeat, not ~60 s
HEARTBEAT_S = 10


def reference(rounds):
    blocks = [party_block("breast_cancer", m, 2) for m in range(2)]
    y, _ = labels("breast_cancer")
    m = VerticalADMM(lam=1e-4, max_rounds=rounds, tol=0).fit([b[0] for b in blocks], y)
    return m.decision_function([b[1] for b in blocks])


def test_tls_and_registered_keys_end_to_end(tmp_path):
    """TLS + SuperNode authentication + party-keys: the in-process result (1e-9), exit 0, no
    process left."""
    procs = Processes(tmp_path / "logs")
    try:
        res = deploy_local(tmp_path, 2, {**BC, "max-rounds": 2}, app_dir=ROOT, processes=procs, timeout=900)
    finally:
        procs.stop_all()
    assert res["exit_code"] == 0, res["record"]
    f = np.load(Path(res["out_dir"]) / "decision_test.npy")
    assert np.max(np.abs(f - reference(2))) <= 1e-9
    assert (tmp_path / "logs" / "zygote.log").is_file()     # the SuperNodes were forked from deploy-local's warm process
    assert json.loads((tmp_path / "party-keys.json").read_text()) == {"0": res["fingerprints"][0],
                                                                     "1": res["fingerprints"][1]}
    assert any_alive(procs.started) == []


def test_registered_key_claiming_another_party_is_refused(tmp_path):
    """Both keys registered, but node 0 runs with party 1's key and vice versa: refused at
    identify, the run fails (exit status 1) with a message naming the node and the party."""
    procs = Processes(tmp_path / "logs")
    try:
        res = deploy_local(tmp_path, 2, {**BC, "max-rounds": 2}, app_dir=ROOT, processes=procs,
                           node_keys={0: 1, 1: 0}, timeout=600)
    finally:
        procs.stop_all()
    assert res["exit_code"] == 1
    assert res["record"]["status"] == "finished:failed"
    assert "claims party" in res["record"]["status-details"], res["record"]
    assert "is not the one party-keys binds to party" in res["record"]["status-details"]
    assert any_alive(procs.started) == []


def test_unregistered_key_is_refused(tmp_path):
    pki = make_pki(tmp_path / "pki", 1)
    link = free_port()
    with Processes(tmp_path / "logs") as procs:
        procs.start("superlink", ["flower-superlink", "--port", link, "--ssl-ca-certfile", pki["ca"],
                                  "--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"],
                                  "--enable-supernode-auth"], cwd=tmp_path)
        time.sleep(5)
        node = procs.start("node", ["flower-supernode", "--superlink", f"127.0.0.1:{link}", "--port", free_port(),
                                    "--root-certificates", pki["ca"], "--auth-supernode-private-key",
                                    pki["nodes"][0]["private"], "--node-config", "partition-id=0"], cwd=tmp_path)
        code = node.wait(timeout=120)
    log = (tmp_path / "logs" / "node.log").read_text()
    assert code == 1            # Flower's exit 305, SUPERNODE_CONNECTION_ERROR: the key is not registered
    assert "could not establish a connection to the SuperLink" in log and "ref-exit-codes/305" in log
    assert any_alive(procs.started) == []


class Loopback:
    """A SuperLink and 2 SuperNodes (insecure, to keep the fault tests short), each SuperNode run
    as ``deploy-local`` runs it (flower-vfl's SuperNode, 0.5 s idle poll, its ClientApps forked by
    a warm executor: two process groups, killed together), with a 10 s heartbeat."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.link = free_port()
        self.home = tmp_path / "flwr_home"
        self.env = loopback_env(self.home)
        self.conn = write_connection(self.home, "loopback", f"127.0.0.1:{self.link}")
        self.procs = Processes(tmp_path / "logs")

    def superlink(self, name="superlink"):
        self.procs.start(name, ["flower-superlink", "--insecure", "--port", self.link,
                                "--disable-runtime-dependency-installation"], self.env, self.tmp)
        time.sleep(4)

    def node(self, m, name=None):
        start_supernode(self.procs, name or f"node{m}", f"127.0.0.1:{self.link}",
                        {"partition-id": m, "state-dir": str(self.tmp / f"party{m}-state")}, self.env, self.tmp,
                        heartbeat=HEARTBEAT_S)

    def kill(self, name):
        """SIGKILL a SuperNode's process group and its executor's."""
        for n in (name, f"{name}-exec"):
            self.procs.stop(n, sig=signal.SIGKILL)

    def nodes_up(self, names=("node0", "node1"), timeout=120):
        """Wait until each SuperNode has its node id from the SuperLink (a short party-wait at
        identify would otherwise race a SuperNode still starting on a loaded machine)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            logs = [self.tmp / "logs" / f"{n}.log" for n in names]
            if all(f.is_file() and "SuperNode ID:" in f.read_text(errors="replace") for f in logs):
                return
            time.sleep(0.5)
        raise AssertionError(f"SuperNodes {names} not connected in {timeout} s")

    def submit(self, rc: str):
        return submit(ROOT, self.conn, rc, self.env)

    def wait(self, run_id, name="run"):
        return wait_run(run_id, self.conn, self.env, self.tmp / "logs" / f"{name}.log", timeout=900)


def _wait_round(report, k, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rep = json.loads(report.read_text())
        except (OSError, ValueError):
            rep = None
        if rep is not None:
            if len(rep.get("rounds", [])) >= k:
                return
            if (rep.get("final") or {}).get("failed"):      # fail now, with the run's reason
                raise AssertionError(f"the run failed before round {k}: {rep['final'].get('error')}")
        time.sleep(0.5)
    raise AssertionError(f"round {k} not reached in {timeout} s")


def test_supernode_killed_and_restarted_gives_the_same_result(tmp_path):
    """SIGKILL party 1's SuperNode after round 1 and start it again (a new node id, an empty
    context.state): the run re-identifies it, re-sends the round re-synchronized, and completes
    with the uninterrupted result (1e-9)."""
    lb, out = Loopback(tmp_path), tmp_path / "out"
    try:
        lb.superlink()
        lb.node(0)
        lb.node(1)
        run_id = lb.submit(f"dataset='breast_cancer' max-rounds=3 out-dir='{out}' round-timeout=90.0 "
                           "party-wait=300.0")
        _wait_round(out / "report.json", 1)
        lb.kill("node1")
        lb.node(1, "node1-restarted")
        record = lb.wait(run_id)
    finally:
        lb.procs.stop_all()
    assert record["status"] == "finished:completed", record
    assert np.max(np.abs(np.load(out / "decision_test.npy") - reference(3))) <= 1e-9
    assert any_alive(lb.procs.started) == []


def test_party_that_never_returns_fails_the_run_with_a_checkpoint(tmp_path):
    lb, out = Loopback(tmp_path), tmp_path / "out"
    try:
        lb.superlink()
        lb.node(0)
        lb.node(1)
        lb.nodes_up()
        run_id = lb.submit(f"dataset='breast_cancer' max-rounds=30 out-dir='{out}' round-timeout=90.0 "
                           "party-wait=5.0")
        _wait_round(out / "report.json", 1)
        lb.kill("node1")
        record = lb.wait(run_id)
    finally:
        lb.procs.stop_all()
    assert record["status"] == "finished:failed"
    assert "party 1 did not come back within party-wait=5 s" in record["status-details"], record
    report = json.loads((out / "report.json").read_text())
    assert report["final"]["failed"] is True and len(report["rounds"]) >= 1
    from flower_vfl.io.checkpoint import load_checkpoint
    assert load_checkpoint(out / "state")[1]["round"] == len(report["rounds"])
    assert any_alive(lb.procs.started) == []


def test_superlink_and_server_app_killed_then_resumed(tmp_path):
    """Kill the SuperLink's process group (the ServerApp with it) and the SuperNodes after round 1,
    start new ones, submit resume=<state folder> (a new Flower run: the parties start with an
    empty context.state and are re-synchronized from the checkpoint): the uninterrupted result
    (1e-9)."""
    lb, out = Loopback(tmp_path), tmp_path / "out"
    try:
        lb.superlink()
        lb.node(0)
        lb.node(1)
        lb.submit(f"dataset='breast_cancer' max-rounds=3 out-dir='{out}'")
        _wait_round(out / "report.json", 1)
        lb.procs.stop("superlink", sig=signal.SIGKILL)
        for name in ("node0", "node1"):
            lb.kill(name)
        done = len(json.loads((out / "report.json").read_text())["rounds"])
        lb.superlink("superlink2")
        lb.node(0, "node0b")
        lb.node(1, "node1b")
        run_id = lb.submit(f"dataset='breast_cancer' max-rounds=3 out-dir='{out}' resume='{out / 'state'}'")
        record = lb.wait(run_id, "resumed")
    finally:
        lb.procs.stop_all()
    assert record["status"] == "finished:completed", record
    assert done < 3
    assert np.max(np.abs(np.load(out / "decision_test.npy") - reference(3))) <= 1e-9
    assert any_alive(lb.procs.started) == []


def test_simulate_exits_non_zero_when_the_server_app_fails(tmp_path, monkeypatch, capsys):
    """`flwr run --stream` would exit 0 here; `flower-vfl simulate` reads the run's status from
    Flower: the a9a files pass the CLI's checks before Flower starts (both present, labels +-1) but
    a feature token is not a column number, so the ServerApp's loader fails; the run is
    finished:failed, exit 1, and the error the log shows is printed (not only Flower's status). The
    job's own SuperLink is stopped (its registry record gone, no process of its group left)."""
    from flower_vfl.cli import main
    from flower_vfl.deploy import local

    monkeypatch.setenv("FLOWER_VFL_RUNTIME_DIR", str(tmp_path / "registry"))
    started = []
    real = local.record_superlink
    monkeypatch.setattr(local, "record_superlink", lambda proc, *a, **k: started.append(proc.pid) or real(proc, *a, **k))
    bad = tmp_path / "a9a-bad"
    bad.mkdir()
    (bad / "a9a").write_text("+1 3:1 xx:1\n-1 5:1\n")
    (bad / "a9a.t").write_text("+1 3:1\n-1 5:1\n")
    code = main(["simulate", "--dataset", "a9a", "--data-dir", str(bad), "--max-rounds", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert "flower-vfl: error: run " in err and " finished:failed\n" in err
    assert (f"  error: DataError: {bad / 'a9a'} is not a valid LIBSVM/svmlight file (invalid literal for int() with base 10: "
            "b'xx'); set n-features if the party's last columns are all zero") in err
    assert len(started) == 1 and any_alive(started) == []
    assert local.recorded_superlinks() == []
