"""A run with a private party, stopped mid-run on a real SuperLink, then resumed (slow).

Loopback SuperLink and 2 SuperNodes (own FLWR_HOME and ports; every process stopped by its group).
Party 1 is private (its node config: ε = 4 over 8 training releases and 1 model release). Once its
first private round is in the report, the ServerApp is stopped with ``flwr stop <run-id>``; the
run is then submitted again with ``resume='<out-dir>/state'`` (a new Flower run: new run id, an
empty ``context.state`` on every node). The resumed run presents the party's plan token from the
checkpoint and continues that plan: no second draw, no second charge, no new plan.

References (no expected number in the code path):

- **the model**: the uninterrupted run over the party's draws. Its noise comes from OS entropy in
  its SuperNode's process, so a second loopback run would draw other noise; instead the run is made
  again in-process, uninterrupted, through the real ClientApp handlers (a fresh ``Context``), by a
  central node that presents the plan token from its first message, against a copy of party 1's
  state-dir: every release of the plan is then served from the party's ledger (the same draws), so
  this run is what an uninterrupted run with those draws gives. Same model to 1e-9.
- **the ledger**: an uninterrupted in-process run on a fresh state-dir makes the plan's releases
  at the same rounds and noise multipliers; the resumed run's ledger holds exactly those, in one
  ledger run, and the accountant gives the same ε (the budget, the plan's calibration).

Duration: about 1.5-3 minutes on an idle 2-core machine (two Flower runs of 12 rounds on
breast_cancer, SuperLink and SuperNodes start-up), more under load.
"""

import shutil
import subprocess

import numpy as np
import pytest

from _party_handlers import _task_identity  # noqa: F401  (autouse fixture)
from flower_vfl.deploy.local import any_alive, start_supernode
from flower_vfl.io.checkpoint import load_checkpoint
from test_deploy_loopback import HEARTBEAT_S, Loopback, _wait_round

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")]

DELTA = 1e-5
PRIVATE = {"dp": True, "dp-epsilon": 4.0, "dp-delta": DELTA, "dp-train-rounds": 8, "dp-eval-rounds": 1,
           "dp-lam": 1e-2}
#: the run config of both Flower runs (the resumed one adds resume=)
RUN = "dataset='breast_cancer' max-rounds=4 lam=0.01 round-timeout=120.0 party-wait=300.0"
IN_PROCESS_RC = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 4, "lam": 1e-2, "party-wait": 0.0}


def _node_configs(tmp_path, tag):
    return {100: {"partition-id": 0, "state-dir": str(tmp_path / f"{tag}-party0")},
            101: {"partition-id": 1, "state-dir": str(tmp_path / f"{tag}-party1"), **PRIVATE}}


def _ledger(nc):
    from flower_vfl.clients.party_private import party_store
    from flower_vfl.clients.source import declared_source
    src = declared_source(nc, IN_PROCESS_RC, nc["partition-id"])
    return [(e.run, e.round, e.kind, e.noise_multiplier, e.mechanism)
            for e in party_store(nc["state-dir"]).entries(src.key)]


def _epsilon(entries):
    from flower_vfl.privacy.accounting import epsilon_for_events
    return epsilon_for_events([(m, z) for *_, z, m in entries], DELTA, "exact")


def _in_process(ncs, rc, run_id, monkeypatch=None, token=None):
    from flower_vfl.apps import client as ca
    from flower_vfl.apps import server as sa
    from flower_vfl.deploy.local_grid import LocalGrid
    from flower_vfl.strategies import checkpointing
    if token is not None:        # the central node presents the plan token from its first identify
        monkeypatch.setattr(checkpointing, "plans", lambda ckpt: dict(token))
    handlers = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}
    st = sa.make_strategy(rc)
    st.start(LocalGrid(handlers, ncs, rc, run_id=run_id))
    return st


def test_private_run_stopped_mid_run_then_resumed_gives_the_uninterrupted_model_and_ledger(tmp_path, monkeypatch):
    lb, out = Loopback(tmp_path), tmp_path / "out"
    ncs = _node_configs(tmp_path, "loopback")
    try:
        lb.superlink()
        for nid, nc in ncs.items():
            start_supernode(lb.procs, f"node{nc['partition-id']}", f"127.0.0.1:{lb.link}", nc, lb.env, lb.tmp,
                            heartbeat=HEARTBEAT_S)
        lb.nodes_up()
        run_id = lb.submit(f"{RUN} out-dir='{out}'")
        _wait_round(out / "report.json", 6)             # rounds 1-4: party 0 alone; 5, 6: party 1's first two
        stop = subprocess.run(["flwr", "stop", run_id, lb.conn], env=lb.env, capture_output=True, text=True,
                              timeout=300)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        first = lb.wait(run_id, "stopped")
        made = _ledger(ncs[101])
        done = load_checkpoint(out / "state")[1]["round"]
        resumed = lb.submit(f"{RUN} out-dir='{out}' resume='{out / 'state'}'")
        record = lb.wait(resumed, "resumed")
    finally:
        lb.procs.stop_all()
    assert any_alive(lb.procs.started) == []
    assert first["status"] != "finished:completed", first        # stopped mid-run, with a part of the plan
    assert 2 <= len(made) < 9 and all(e[2] == "train" for e in made), made
    assert 6 <= done < 12, done                                # its checkpoint: mid-run, after a private round
    print(f"stopped: {first['status']}, checkpoint round {done}, {len(made)} of 9 releases made")
    assert record["status"] == "finished:completed", record.get("status-details", record)
    got = _ledger(ncs[101])
    token = load_checkpoint(out / "state")[1]["plans"]          # party -> plan token, as the resume sent it
    assert set(token) == {"1"}
    assert got[:len(made)] == made and {e[0] for e in got} == {made[0][0]}    # one plan: the first run's

    # the ledger of an uninterrupted run: the same releases at the same noise multipliers, the same ε
    clean = _node_configs(tmp_path, "clean")
    _in_process(clean, {**IN_PROCESS_RC, "state-dir": str(tmp_path / "clean-server")}, run_id=1)
    want = _ledger(clean[101])
    assert [e[1:] for e in got] == [e[1:] for e in want]
    assert _epsilon(got) == _epsilon(want) == pytest.approx(4.0, rel=1e-9)

    # the model of the uninterrupted run over the party's draws (module doc), against a copy of its state
    ref = _node_configs(tmp_path, "ref")
    shutil.copytree(ncs[101]["state-dir"], ref[101]["state-dir"])
    st = _in_process(ref, {**IN_PROCESS_RC, "state-dir": str(tmp_path / "ref-server")}, run_id=7,
                     monkeypatch=monkeypatch, token=token)
    assert _ledger(ref[101]) == got                           # served from the ledger: no new release
    assert np.max(np.abs(np.load(out / "decision_test.npy") - st.decision_test_)) <= 1e-9
