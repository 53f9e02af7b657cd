"""Issue 23.3 on a real SuperLink (slow): a SuperNode with TLS and its registered key, killed mid-run
and restarted, rejoins and the run ends bitwise equal to an uninterrupted one.

With node authentication the SuperLink binds a node id to the registered key, so the restarted
SuperNode comes back with the SAME node id, in a new session (``NodeInfo.last_activated_at``).

- **early**: party 1's SuperNode is killed (SIGKILL, its process group) right after round 1 and
  started again at once, as a supervisor would (systemd ``Restart=on-failure``): the SuperLink
  refuses the key (Flower exit 305, "could not be activated") while the old session is still
  online, i.e. up to 2 heartbeat intervals after its last heartbeat; the supervisor loop starts
  it again every few seconds until it is let in;
- **late**: party 0's SuperNode is killed after round 2 and started again only once the SuperLink
  has marked it offline (the strategy got NODE_UNAVAILABLE for it and put the node aside).

CI time: party 0's SuperNode (the late case) announces a heartbeat interval of 10 s
(:data:`HEARTBEAT_S`, the least the SuperLink accepts: ``flower-vfl-supernode --heartbeat 10``;
flwr 1.42's SuperNode hard-codes 30 s), so its old session is offline after 20 s
instead of 60 s; party 1's (the early case) keeps Flower's 30 s, so that its restart is refused
as shipped (a 20 s window is shorter than a SuperNode's start-up under load: it was let in at
once). Nothing else of Flower is changed. 3 rounds: the early restart after round 1, the late one after round 2. Each
SuperNode runs with ``--isolation process`` and the warm executor, as ``deploy-local`` does (a
message's ClientApp is forked, not a new interpreter); a killed node's executor is killed with it.

Both times the strategy notices the new session, identifies the node again (its claim checked
against ``party-keys``), re-synchronizes the party from its last round and goes on.
"""

import json
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from flower_vfl.deploy.local import (Processes, any_alive, free_port, loopback_env, make_pki, start_supernode,
                                     submit, wait_run, write_connection)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")]
ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
#: the heartbeat interval the SuperNodes announce (flwr 1.42: 30 s hard-coded; the SuperLink
#: accepts 10..1800 s and marks a node offline HEARTBEAT_PATIENCE = 2 intervals after its last one)
HEARTBEAT_S = 10
#: seconds after which a killed node's old session is surely offline at the SuperLink
OFFLINE_AFTER_S = 2 * HEARTBEAT_S + 5


class SecureLoopback:
    """A TLS SuperLink with node authentication, both node keys registered and bound to parties."""

    def __init__(self, tmp):
        self.tmp, self.link = tmp, free_port()
        self.home = tmp / "flwr_home"
        self.env = loopback_env(self.home)
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
        import subprocess
        for m in range(2):
            deadline = time.monotonic() + 120       # the SuperLink may take a while to listen under load
            while True:
                res = subprocess.run(["flwr", "supernode", "register", str(p["nodes"][m]["public"]), self.conn],
                                     env=self.env, capture_output=True, text=True, timeout=120)
                if res.returncode == 0 or "SuperLink is unavailable" not in res.stdout + res.stderr \
                        or time.monotonic() > deadline:
                    break
                time.sleep(2)
            assert res.returncode == 0, res.stdout + res.stderr

    def node(self, m, name):
        """Party m's SuperNode with ``--isolation process`` and its warm executor (as
        ``deploy-local`` starts them: a message's ClientApp is forked, not a new interpreter)."""
        return start_supernode(self.procs, name, f"127.0.0.1:{self.link}", f"partition-id={m}", self.env, self.tmp,
                               exec_name=f"exec-{name}", root_certificates=self.pki["ca"],
                               auth_key=self.pki["nodes"][m]["private"], heartbeat=HEARTBEAT_S if m == 0 else None)

    def kill(self, name):
        """SIGKILL a SuperNode's process group and its executor's."""
        self.procs.stop(name, sig=signal.SIGKILL)
        self.procs.stop(f"exec-{name}", sig=signal.SIGKILL)

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
            self.procs.stop(f"exec-{name}")
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
    t0 = time.monotonic()
    try:
        lb.start()
        lb.node(0, "node0")
        lb.node(1, "node1")
        ids = [lb.node_id("node0"), lb.node_id("node1")]
        run_id = submit(ROOT, lb.conn, f"dataset='breast_cancer' max-rounds={ROUNDS} out-dir='{out}' "
                                       f"party-keys='{lb.keys}' round-timeout=300.0 party-wait=400.0", lb.env)
        _wait_round(out / "report.json", 1)
        # early: killed after round 1, started again at once (refused while the old session is online)
        lb.kill("node1")
        id1, refused = lb.restart_until_admitted(1, "node1-restart")
        t_early = time.monotonic()
        _wait_round(out / "report.json", 2)
        # late: killed after round 2, started again once the SuperLink holds it offline
        lb.kill("node0")
        time.sleep(OFFLINE_AFTER_S)
        id0, late_refused = lb.restart_until_admitted(0, "node0-restart")
        t_late = time.monotonic()
        record = wait_run(run_id, lb.conn, lb.env, tmp_path / "logs" / "run.log", timeout=1200)
        t_end = time.monotonic()
        print(f"timing: setup, round 1, early restart {t_early - t0:.0f} s (refused {refused}x), then round 2 "
              f"{t_late - t_early - OFFLINE_AFTER_S:.0f} s + {OFFLINE_AFTER_S} s offline wait, to the end "
              f"{t_end - t_late:.0f} s")
    finally:
        lb.procs.stop_all()
    run_log = (tmp_path / "logs" / "run.log").read_text(errors="replace")
    assert record["status"] == "finished:completed", (record, run_log[-4000:])
    assert [id0, id1] == ids                          # the key-bound node ids came back
    # early: the SuperLink refused the key while the old session was online (the SuperNode then
    # retries by itself, or exits with Flower's 305 and the supervisor loop starts it again);
    # late: let in at once
    link_log = lb.log("superlink")
    assert link_log.count(f"SuperNode with node ID {ids[1]} could not be activated") + refused >= 1
    assert f"SuperNode with node ID {ids[0]} could not be activated" not in link_log and late_refused == 0
    assert f"party 1 is back on node {ids[1]}" in run_log and f"party 0 is back on node {ids[0]}" in run_log
    ref = uninterrupted(rc)
    assert np.array_equal(np.load(out / "decision_test.npy"), ref.decision_test_)
    report = json.loads((out / "report.json").read_text())
    assert [r["train_loss"] for r in report["rounds"]] == [r["train_loss"] for r in ref.history_]
    assert any_alive(lb.procs.started) == []
