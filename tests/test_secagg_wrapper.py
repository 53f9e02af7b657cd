"""Secure aggregation wraps the vertical strategy's sums (strategies/sums.py, secagg_central.py's
SecureSums) instead of branching inside the strategy: the strategy's module reads ``secagg`` only to
choose the run's sums; the plain and the secure sums, driven through the real ClientApp handlers on a
LocalGrid (a fresh Context per node and run), give the same model to the fixed-point error."""

import ast
import pathlib
import warnings

import numpy as np
import pytest

from flower_vfl.apps import client as ca
from flower_vfl.apps.server import make_strategy
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.secagg import FixedPoint
from flower_vfl.strategies.secagg_central import SecureExchange, SecureSums
from flower_vfl.strategies.sums import PlainSums, Sums

warnings.filterwarnings("ignore", category=UserWarning)

STRATEGIES = pathlib.Path(__file__).resolve().parents[1] / "flower_vfl" / "strategies"
H = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify,
     "query.secagg_keys": ca.secagg_keys}
ROUNDS = 6


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity
    for attr, value in (("_run_id", 1), ("_task_id", 0), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def _secagg_reads(path):
    """(attribute reads named ``secagg``, comparisons or tests that mention one) in a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "secagg"]
    tests = [n for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp, ast.Compare, ast.BoolOp))
             and any(isinstance(a, ast.Attribute) and a.attr == "secagg" for a in ast.walk(n))]
    return reads, tests


def test_the_vertical_strategy_reads_secagg_once_to_choose_its_sums_and_never_branches_on_it():
    reads, tests = _secagg_reads(STRATEGIES / "vertical_admm.py")
    assert len(reads) == 1 and not tests            # sums_for(self.config.secagg), in new_state
    for module in ("vertical_rounds.py", "sums.py"):
        assert _secagg_reads(STRATEGIES / module) == ([], [])


def test_both_sums_answer_every_question_the_strategy_asks():
    asked = {n for n in vars(Sums) if not n.startswith("_")} | set(Sums.__annotations__)
    assert {"train", "test_total", "begin", "wrap", "agreement"} <= asked
    for sums in (PlainSums(), SecureSums()):
        assert not sorted(n for n in asked if not hasattr(sums, n)), type(sums).__name__


def run(secagg: bool):
    cfg = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": ROUNDS, "secagg": secagg, "lam": 1e-3,
           "acceleration": "none", "variant": "sharing-fixed", "party-wait": 5.0}
    grid = LocalGrid(H, {100 + i: {"partition-id": i} for i in range(2)}, cfg)
    st = make_strategy(cfg)
    st.start(grid=grid, num_rounds=ROUNDS, timeout=60)
    return st


def test_plain_and_secure_sums_give_the_same_model_through_the_real_handlers():
    """Two parties (the fewest a secure sum takes), alpha = 1: the plain sums send each party its
    x-update target alone, the secure ones the same (q, y) and the roster to both; each round's
    secure sum is the plain one to M/(2 scale) per entry (FixedPoint's bound, 3.6e-12 at M = 2).
    ADMM carries it through ROUNDS rounds and one test-score sum; allowing 100x amplification per
    sum: (ROUNDS + 1) * 100 * M/(2 scale) = 2.5e-9. Measured: 3.6e-12 on the test scores."""
    plain, secure = run(False), run(True)
    assert type(plain.sums_) is PlainSums and plain.secagg is None and plain.exchange.__class__ is not SecureExchange
    assert type(secure.sums_) is SecureSums and secure.secagg.key_agreements == 1
    assert isinstance(secure.exchange, SecureExchange) and secure.acceleration_ == "none"
    bound = (ROUNDS + 1) * 100 * FixedPoint([1e4] * 2).error_bound
    assert bound < 3e-9
    assert np.max(np.abs(secure.decision_test_ - plain.decision_test_)) <= bound
    assert np.max(np.abs(np.asarray(secure.central.b) - np.asarray(plain.central.b))) <= bound
    assert len(secure.history_) == len(plain.history_) == ROUNDS
    for a, b in zip(secure.history_, plain.history_):
        assert abs(a["train_loss"] - b["train_loss"]) <= bound
        assert a["stale"] == b["stale"] == 0 and a["parties"] == b["parties"] == 2
    assert secure.final_["test_accuracy"] == plain.final_["test_accuracy"]
