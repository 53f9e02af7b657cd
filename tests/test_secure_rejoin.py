"""Issue 23.3 on a real SuperLink (slow): a SuperNode with TLS and its registered key, killed mid-run
and restarted, rejoins and the run ends bitwise equal to an uninterrupted one.

With node authentication the SuperLink binds a node id to the registered key, so the restarted
SuperNode comes back with the SAME node id, in a new session (``NodeInfo.last_activated_at``).

- **early**: party 1's SuperNode is killed (SIGKILL, its process group) right after round 1 and
  started again at once, as a supervisor would (systemd ``Restart=on-failure``): the SuperLink
  refuses the key (Flower exit 305, "could not be activated") while the old session is still
  online, i.e. up to 2 heartbeat intervals (2 x 30 s in flwr 1.42) after its last heartbeat;
  the supervisor loop starts it again every few seconds until it is let in;
- **late**: party 0's SuperNode is killed after round 3 and started again only once the SuperLink
  has marked it offline (the strategy got NODE_UNAVAILABLE for it and put the node aside).

Both times the strategy notices the new session, identifies the node again (its claim checked
against ``party-keys``), re-synchronizes the party from its last round and goes on.
"""

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flower_vfl.deploy.local import Processes, any_alive, free_port, make_pki, submit, wait_run, write_connection

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")]
ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 4
#: seconds after which a killed node's old session is surely offline at the SuperLink (flwr 1.42:
#: HEARTBEAT_PATIENCE 2 x HEARTBEAT_DEFAULT_INTERVAL 30 s after its last heartbeat)
OFFLINE_AFTER_S = 65


class SecureLoopback:
    """A TLS SuperLink with node authentication, both node keys registered and bound to parties."""

    def __init__(self, tmp):
        self.tmp, self.link = tmp, free_port()
        self.home = tmp / "flwr_home"
        self.env = dict(os.environ, FLWR_HOME=str(self.home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                        FLWR_SUPEREXEC_TASK_POLL_INTERVAL="0.2")
        self.env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), self.env.get("PATH", "")])
        self.pki = make_pki(tmp / "pki", 2)
        self.conn = write_connection(self.home, "secure", f"127.0.0.1:{self.link}", self.pki["ca"])
        self.procs = Processes(tmp / "logs")
        self.keys = tmp / "party-keys.json"
        self.keys.write_text(json.dumps({str(m): self.pki["nodes"][m]["fingerprint"] for m in range(2)}))

    def start(self):
        p = self.pki
        self.procs.start("superlink", ["flower-superlink", "--port", self.link, "--ssl-ca-certfile", p["ca"],
                                       "--ssl-certfile", p["cert"], "--ssl-keyfile", p["key"],
                                       "--enable-supernode-auth", "--disable-runtime-dependency-installation"],
                         self.env, self.tmp)
        time.sleep(4)
        import subprocess
        for m in range(2):
            res = subprocess.run(["flwr", "supernode", "register", str(p["nodes"][m]["public"]), self.conn],
                                 env=self.env, capture_output=True, text=True, timeout=120)
            assert res.returncode == 0, res.stdout + res.stderr

    def node(self, m, name):
        return self.procs.start(name, [sys.executable, "-m", "flower_vfl.deploy.supernode", "--idle-poll", "0.5",
                                       "--superlink", f"127.0.0.1:{self.link}", "--port", free_port(),
                                       "--root-certificates", self.pki["ca"],
                                       "--auth-supernode-private-key", self.pki["nodes"][m]["private"],
                                       "--node-config", f"partition-id={m}"], self.env, self.tmp)

    def log(self, name):
        f = self.tmp / "logs" / f"{name}.log"
        return f.read_text(errors="replace") if f.is_file() else ""

    def node_id(self, name, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log(name).splitlines():
                if "SuperNode ID:" in line:
                    return int(line.rsplit(":", 1)[1])
            time.sleep(0.5)
        raise AssertionError(f"{name} got no node id in {timeout} s:\n{self.log(name)[-3000:]}")

    def restart_until_admitted(self, m, prefix, timeout=180):
        """Start party m's SuperNode again and again (3 s apart) until the SuperLink lets it in;
        returns (the node id, how many starts were refused)."""
        deadline, refused = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            name = f"{prefix}{refused}"
            proc = self.node(m, name)
            while proc.poll() is None and "SuperNode ID:" not in self.log(name):
                time.sleep(0.3)
            if proc.poll() is None:
                return self.node_id(name), refused
            assert "ref-exit-codes/305" in self.log(name), self.log(name)[-3000:]     # Flower's refusal
            refused += 1
            time.sleep(3)
        raise AssertionError(f"party {m}'s SuperNode not admitted within {timeout} s")


def _wait_round(report, k, timeout=900):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rep = json.loads(report.read_text())
        except (OSError, ValueError):
            rep = None
        if rep is not None:
            if len(rep.get("rounds", [])) >= k:
                return rep
            if (rep.get("final") or {}).get("failed"):
                raise AssertionError(f"the run failed before round {k}: {rep['final'].get('error')}")
        time.sleep(0.3)
    raise AssertionError(f"round {k} not reached in {timeout} s")


def uninterrupted(rc):
    """The same run in process (the real ServerApp strategy and ClientApp handlers)."""
    from flower_vfl.apps import client as ca
    from flower_vfl.apps import server as sa
    from flower_vfl.deploy.local_grid import LocalGrid
    st = sa.make_strategy(rc)
    st.start(LocalGrid({"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify},
                       {100 + m: {"partition-id": m} for m in range(2)}, rc))
    return st


def test_secure_supernode_killed_and_restarted_early_and_late_rejoins_bitwise(tmp_path):
    lb, out = SecureLoopback(tmp_path), tmp_path / "out"
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": ROUNDS}
    try:
        lb.start()
        lb.node(0, "node0")
        lb.node(1, "node1")
        ids = [lb.node_id("node0"), lb.node_id("node1")]
        run_id = submit(ROOT, lb.conn, f"dataset='breast_cancer' max-rounds={ROUNDS} out-dir='{out}' "
                                       f"party-keys='{lb.keys}' round-timeout=300.0 party-wait=400.0", lb.env)
        _wait_round(out / "report.json", 1)
        # early: killed after round 1, started again at once (refused while the old session is online)
        lb.procs.stop("node1", sig=signal.SIGKILL)
        id1, refused = lb.restart_until_admitted(1, "node1-restart")
        _wait_round(out / "report.json", 3)
        # late: killed after round 3, started again once the SuperLink holds it offline
        lb.procs.stop("node0", sig=signal.SIGKILL)
        time.sleep(OFFLINE_AFTER_S)
        id0, late_refused = lb.restart_until_admitted(0, "node0-restart")
        record = wait_run(run_id, lb.conn, lb.env, tmp_path / "logs" / "run.log", timeout=1200)
    finally:
        lb.procs.stop_all()
    run_log = (tmp_path / "logs" / "run.log").read_text(errors="replace")
    assert record["status"] == "finished:completed", (record, run_log[-4000:])
    assert [id0, id1] == ids                          # the key-bound node ids came back
    assert refused >= 1 and late_refused == 0         # early: Flower's 305 first; late: let in at once
    assert f"party 1 is back on node {ids[1]}" in run_log and f"party 0 is back on node {ids[0]}" in run_log
    ref = uninterrupted(rc)
    assert np.array_equal(np.load(out / "decision_test.npy"), ref.decision_test_)
    report = json.loads((out / "report.json").read_text())
    assert [r["train_loss"] for r in report["rounds"]] == [r["train_loss"] for r in ref.history_]
    assert any_alive(lb.procs.started) == []
