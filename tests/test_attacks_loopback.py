"""A malicious central node against flower-vfl's own ClientApp, through a real SuperLink and
SuperNodes (slow): the attacks of issue 20 that need a process boundary — new runs, another
``num-parties`` — each answered by the party's own ledger on its own disk.

The ServerApp is ``tests/apps/malicious/malicious_server.py``: submitted with ``flwr run`` like
any app, it asks the party for training releases with q = y = 0 under whatever run config the
attacker chooses. Every process is started in its own session and stopped by process group.
"""

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from flower_vfl.deploy.local import Processes, any_alive, free_port, submit, wait_run, write_connection

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")]
APP = Path(__file__).resolve().parent / "apps" / "malicious"


class Link:
    def __init__(self, tmp):
        self.tmp, self.port = tmp, free_port()
        self.env = dict(os.environ, FLWR_HOME=str(tmp / "flwr_home"),
                        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
        self.conn = write_connection(tmp / "flwr_home", "loopback", f"127.0.0.1:{self.port}")
        self.procs = Processes(tmp / "logs")
        self.procs.start("superlink", ["flower-superlink", "--insecure", "--port", self.port,
                                       "--disable-runtime-dependency-installation"], self.env, tmp)
        time.sleep(4)

    def node(self, name, node_config):
        self.procs.start(name, ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                                "--port", free_port(), "--node-config", node_config], self.env, self.tmp)

    def attack(self, name, rc):
        out = self.tmp / name
        out.mkdir()
        run = submit(APP, self.conn, f'{rc} out-dir="{out}"', self.env)
        rec = wait_run(run, self.conn, self.env, self.tmp / "logs" / f"{name}.log", timeout=600)
        assert rec["status"] == "finished:completed", rec
        return json.loads((out / "attack.json").read_text())


def _releases(log):
    return [t for node in log["nodes"].values() for t in node["train"] if "release_norm" in t]


def _refusals(log):
    return [t["refusal"] for node in log["nodes"].values() for t in node["train"] if "refusal" in t]


def test_another_num_parties_in_a_new_run_does_not_reset_the_budget(tmp_path):
    """The party plans 3 training + 1 evaluation release at ε = 1. Run A (num-parties=2) takes 3
    training releases. Run B (num-parties=3: another column block of the same people) must find
    them in the same ledger: at most 1 more release (the 4th of the plan), then refusals naming
    the budget; never 3 fresh ones."""
    link = Link(tmp_path)
    try:
        link.node("party0", f'partition-id=0 dp=true dp-epsilon=1.0 dp-train-rounds=3 dp-eval-rounds=1 '
                            f'state-dir="{tmp_path / "p0"}"')
        a = link.attack("runA", 'dataset="breast_cancer" num-parties=2 max-rounds=3')
        b = link.attack("runB", 'dataset="breast_cancer" num-parties=3 max-rounds=3')
    finally:
        link.procs.stop_all()
    assert len(_releases(a)) == 3, a
    assert len(_releases(a)) + len(_releases(b)) <= 4, b
    refusals = _refusals(b)
    assert refusals and all(r["code"] in ("budget", "plan") for r in refusals), b
    assert any_alive(link.procs.started) == []
