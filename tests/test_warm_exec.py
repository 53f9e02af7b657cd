"""The warm SuperExec (flower_vfl.deploy.warm_exec) on real Flower processes (slow): TLS to the
SuperLink, registered SuperNode keys bound to parties, ``--isolation process`` with each
message's ClientApp forked from the warm process: the run completes with the in-process
engine's decision values (1e-9) and no process is left."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from flower_vfl import VerticalADMM
from flower_vfl.io.data import labels, party_block
from flower_vfl.deploy.local import Processes, any_alive, deploy_local

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")
def test_warm_isolation_end_to_end_matches_the_engine(tmp_path):
    procs = Processes(tmp_path / "logs")
    try:
        res = deploy_local(tmp_path, 2, {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 3},
                           app_dir=ROOT, processes=procs, timeout=900, isolation="warm")
    finally:
        procs.stop_all()
    assert res["exit_code"] == 0, res["record"]
    blocks = [party_block("breast_cancer", m, 2) for m in range(2)]
    y, _ = labels("breast_cancer")
    ref = VerticalADMM(lam=1e-4, max_rounds=3, tol=0).fit([b[0] for b in blocks], y) \
        .decision_function([b[1] for b in blocks])
    assert np.max(np.abs(np.load(Path(res["out_dir"]) / "decision_test.npy") - ref)) <= 1e-9
    # served by the warm process (its children log there), not by a flwr-clientapp interpreter
    assert "Start `flwr-clientapp` process" not in (tmp_path / "logs" / "node0.log").read_text()
    assert (tmp_path / "logs" / "exec0.log").is_file()
    assert any_alive(procs.started) == []


def test_unknown_isolation_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"isolation='thread'; choose one of \('subprocess', 'warm'\)"):
        deploy_local(tmp_path, 2, {}, isolation="thread")


def test_supernode_launcher_caps_only_flowers_idle_sleep(monkeypatch):
    """flower-vfl-supernode: inside Flower's SuperNode loop module the hard-coded 3 s idle sleep
    becomes --idle-poll and its 0.5 s reply waits stay 0.5 s; ``time`` elsewhere is untouched."""
    import time

    import flwr.supernode.start_client_internal as sci

    from flower_vfl.deploy import supernode

    monkeypatch.setattr(sci, "time", time)          # undone after the test
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    assert supernode.cap_idle_sleep(0.25) is True
    sci.time.sleep(3)
    sci.time.sleep(0.5)
    time.sleep(3)
    assert slept == [0.25, 0.25, 3]
    assert supernode.cap_idle_sleep(0.5) is True    # patching twice only moves the cap
    sci.time.sleep(3)
    sci.time.sleep(0.5)
    assert slept[3:] == [0.5, 0.5]
    assert sci.time.monotonic is time.monotonic     # everything else is the time module's


@pytest.mark.parametrize("argv, message", [
    (["--idle-poll", "0"], "--idle-poll='0' is out of range; give seconds between 0.05 and 3.0 (default 0.5)"),
    (["--idle-poll=fast"], "--idle-poll='fast' is not a number; give seconds between 0.05 and 3.0 (default 0.5)"),
    (["--idle-poll"], "--idle-poll needs a value in seconds (default 0.5)"),
])
def test_supernode_launcher_refuses_a_bad_idle_poll(argv, message, capsys):
    from flower_vfl.deploy import supernode

    assert supernode.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"flower-vfl-supernode: {message}"


def test_deploy_local_refuses_a_bad_idle_poll(tmp_path):
    with pytest.raises(ValueError, match=r"^--idle-poll=5 is out of range"):
        deploy_local(tmp_path, 2, {"dataset": "breast_cancer"}, idle_poll=5)
