"""The round loop written once (core/rounds.py) keeps the numbers: the engine and the Flower
strategy give bitwise the trajectories of the code before the refactor (tests/data/
trajectories_ref.npz, written by benchmarks/trajectory_check.py under the reference tree), and
bitwise each other's, private parties included (same noise draw in both paths)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from flower_vfl.privacy import mechanism

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("trajectory_check", ROOT / "benchmarks" / "trajectory_check.py")
tc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tc)
REF = dict(np.load(ROOT / "tests" / "data" / "trajectories_ref.npz"))
A9A = ROOT.parent / "shared" / "data" / "a9a"
#: the one change: the engine's history of a private run is now the central node's (train_loss
#: on the released s_m, no objective: a private party's lam R(x_m) is not released), as Flower's
CHANGED = {"train_loss", "objective"}


def check(case, private, monkeypatch, data_dir=None):
    monkeypatch.setattr(mechanism.GaussianOutputMechanism, "rng", tc.noise_rng)
    got = tc.run_case(case, private, data_dir)
    tag = f"{case}_{'private' if private else 'plain'}"
    for key, value in got.items():
        ref = REF[f"{tag}/{key}"]
        if private and key == "engine/history":
            keep = [j for j, c in enumerate(tc.COLUMNS) if c not in CHANGED]
            assert np.array_equal(value[:, keep], ref[:, keep]), key
        else:
            assert np.array_equal(value, ref, equal_nan=True), key
    for what in ("history", "coef", "intercept", "decision_sha256", "decision_head"):
        assert np.array_equal(got["engine/" + what], got["flower/" + what], equal_nan=True), what
    if private:
        assert np.isnan(got["engine/history"][:, tc.COLUMNS.index("objective")]).all()


@pytest.mark.parametrize("private", [False, True])
def test_breast_cancer_trajectories_are_the_references_bitwise(private, monkeypatch):
    check("bc", private, monkeypatch)


@pytest.mark.skipif(not (A9A / "a9a").is_file(), reason=f"a9a data not in {A9A}")
@pytest.mark.parametrize("private", [False, True])
def test_a9a_paper_split_trajectories_are_the_references_bitwise(private, monkeypatch):
    check("a9a", private, monkeypatch, str(A9A))
