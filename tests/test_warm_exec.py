"""The warm SuperExec (flower_vfl.warm_exec) on real Flower processes (slow): TLS to the
SuperLink, registered SuperNode keys bound to parties, ``--isolation process`` with each
message's ClientApp forked from the warm process: the run completes with the in-process
engine's decision values (1e-9) and no process is left."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from flower_vfl import VerticalADMM
from flower_vfl.data import labels, party_block
from flower_vfl.deploy import Processes, any_alive, deploy_local

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
