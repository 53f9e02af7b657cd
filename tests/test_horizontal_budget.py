"""Horizontal agents under the vertical party's rules (issue 20, item 6), through the real
ClientApp handlers of :mod:`flower_vfl.apps.horizontal` with a fresh Flower ``Context`` per run:
a private agent needs a node-level budget, one ledger composes Laplace (ObjP/ObjT) and Gaussian
(OutP) releases in one PLD, a new ``hz-num-agents`` / ``hz-split`` of the same samples is the
same ledger, and no agent has a seed. The loader is patched to scikit-learn's digits (10
classes, pixels in [0, 1]) so a message costs milliseconds; the handlers are the real ones."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import horizontal as hz
from flower_vfl.config.schema import ConfigError
from flower_vfl.privacy import epsilon_for_events
from flower_vfl.privacy.store import PartyStore

DELTA = 1e-5
RC = {"hz-num-agents": 4, "hz-split": "iid"}


@pytest.fixture(autouse=True)
def digits(monkeypatch):
    from sklearn.datasets import load_digits
    import flower_vfl.datasets as ds
    X, y = load_digits(return_X_y=True)
    data = (X / 16.0, y, X[:50] / 16.0, y[:50])
    monkeypatch.setattr(ds, "load_fashion_mnist", lambda data_dir=None: data)
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0
    return data


def node(tmp_path, **kw):
    return {"partition-id": 1, "data-dir": str(tmp_path / "fmnist"), "state-dir": str(tmp_path / "agent1"),
            "dp-eps-bar": 0.5, "dp-max-epsilon": 5.0, **kw}


def train(nc, run, t=1, variant="objt", run_config=None, w=None, final=False):
    """One round of a run as a (possibly malicious) server sends it."""
    context = Context(run_id=run, node_id=9, node_config=dict(nc), state=RecordDict(),
                      run_config=dict(RC if run_config is None else run_config))
    cfg = {"t": t, "rho": 5.0, "variant": variant, "a": 1.0, "beta": 1e-4, "box": 1.0, "trust": "paper",
           "I": 1797, "P": 4, "final": final}
    w = np.zeros((64, 10)) if w is None else w
    rd = RecordDict({"config": ConfigRecord(cfg), "arrays": ArrayRecord({"w": Array(w)})})
    return hz.train(Message(rd, dst_node_id=9, message_type="train"), context)


def entries(nc):
    store = PartyStore(nc["state-dir"])
    out = {src: store.entries(src) for src, _ in store.sources()}
    store.close()
    return out


def test_a_private_agent_without_a_budget_or_with_a_seed_does_not_start(tmp_path):
    nc = node(tmp_path)
    del nc["dp-max-epsilon"]
    with pytest.raises(ConfigError, match=r"^agent 1: node config dp-eps-bar=0.5 makes this agent private, and a "
                                          r"private agent needs a budget over every release on its data: set "
                                          r"'dp-max-epsilon'"):
        train(nc, 1)
    with pytest.raises(ConfigError, match=r"^agent 1: node config key 'dp-seed'=7 is refused"):
        train(node(tmp_path, **{"dp-seed": 7}), 1)
    assert not (tmp_path / "agent1").exists()                     # refused before anything was written


def test_many_runs_are_capped_by_the_one_ledger(tmp_path):
    """Before: no cross-run cap without dp-max-epsilon (200 runs -> PLD ε 47). Now the cap is
    required and every run composes: 25 one-round runs at ε̄ = 0.5 against dp-max-epsilon = 5
    release exactly as many rounds as the PLD allows (10), then every run is refused, naming the cap."""
    nc = node(tmp_path)
    fits = max(n for n in range(1, 25) if epsilon_for_events([("laplace", 2.0)] * n, DELTA, "pld") <= 5.0)
    replies = [train(nc, run) for run in range(1, 26)]
    released = ["release" in r.content for r in replies]
    assert released == [True] * fits + [False] * (25 - fits)
    reason = str(replies[fits].content["refusal"]["reason"])
    assert reason.startswith(f"agent 1: one more laplace release (round t=1) would bring the total on its data to "
                             f"epsilon={epsilon_for_events([('laplace', 2.0)] * (fits + 1), DELTA, 'pld'):.4g}")
    assert f"above its dp-max-epsilon=5; already spent epsilon=" in reason and f"over {fits} release(s)" in reason
    (src, rows), = entries(nc).items()
    assert len(rows) == fits and {r.run for r in rows} == {str(r) for r in range(1, fits + 1)}
    spent = epsilon_for_events([(r.mechanism, r.noise_multiplier) for r in rows], DELTA, "pld")
    assert fits == 10 and spent == pytest.approx(4.98996, abs=1e-4) and spent <= 5.0


def test_laplace_and_gaussian_compose_in_one_pld_against_the_cap(tmp_path):
    """Before: the cap was per mechanism (Laplace + Gaussian composed to 5.31 against a cap of 3).
    Now 2 ObjT (Laplace) runs and then 8 OutP (Gaussian) runs share one ledger against a cap of
    2.75: the 2 Laplace releases alone (ε 2.0) and the 8 Gaussian ones alone (ε 2.14) would each
    fit, their mix (ε 3.98) does not, and the Gaussian runs stop where the mixed PLD reaches the cap."""
    nc = node(tmp_path, **{"dp-eps-bar": 1.0, "dp-max-epsilon": 2.75})
    z_g = float(np.sqrt(2 * np.log(1.25 / 1e-6)))                 # OutP: sqrt(2 ln(1.25/δ̄)) / ε̄
    lap, gau = [("laplace", 1.0)] * 2, [("gaussian", z_g)] * 8
    assert epsilon_for_events(lap, DELTA, "pld") <= 2.75 and epsilon_for_events(gau, DELTA, "pld") <= 2.75
    assert epsilon_for_events(lap + gau, DELTA, "pld") == pytest.approx(3.977, abs=1e-3)
    assert all("release" in train(nc, run).content for run in (1, 2))
    outp = [train(nc, run, variant="outp") for run in range(3, 11)]
    m = max(k for k in range(9) if epsilon_for_events(lap + [("gaussian", z_g)] * k, DELTA, "pld") <= 2.75)
    assert 0 < m < 8
    assert ["release" in r.content for r in outp] == [True] * m + [False] * (8 - m)
    assert "one more gaussian release (round t=1)" in str(outp[m].content["refusal"]["reason"])
    (src, rows), = entries(nc).items()
    assert [r.mechanism for r in rows] == ["laplace"] * 2 + ["gaussian"] * m
    assert [r.noise_multiplier for r in rows[2:]] == pytest.approx([z_g] * m, rel=1e-6)
    spent = epsilon_for_events([(r.mechanism, r.noise_multiplier) for r in rows], DELTA, "pld")
    assert spent <= 2.75 < epsilon_for_events([(r.mechanism, r.noise_multiplier) for r in rows]
                                              + [("gaussian", z_g)], DELTA, "pld")


def test_another_split_or_agent_count_of_the_same_samples_is_the_same_ledger(tmp_path):
    """Before: hz-num-agents / hz-split gave new fingerprints, so new budgets. Now the key is what
    the node config declares (the data folder and partition-id): every split composes in it."""
    nc = node(tmp_path, **{"dp-max-epsilon": 100.0})
    splits = [{"hz-num-agents": 4, "hz-split": "iid"}, {"hz-num-agents": 5, "hz-split": "iid"},
              {"hz-num-agents": 3, "hz-split": "dirichlet", "hz-dirichlet-alpha": 0.5},
              {"hz-num-agents": 2, "hz-split": "iid"}]
    for run, rc in enumerate(splits, start=1):
        assert "release" in train(nc, run, run_config=rc).content
    (src, rows), = entries(nc).items()
    assert len(rows) == 4 and '"dataset":"fashion_mnist"' in src and '"partition-id":1' in src
    assert str((tmp_path / "fmnist").resolve()) in src


def test_an_agent_draws_fresh_noise_in_every_run(tmp_path):
    """No seed: two runs answering the same message release different z (a difference of two
    runs does not cancel the noise), and a re-sent round in the same run gets the stored answer."""
    nc = node(tmp_path)
    a, b = (train(nc, run).content["release"]["z"].numpy() for run in (1, 2))
    assert np.abs(a - b).max() > 1e-3
    again = train(nc, 1).content["release"]["z"].numpy()         # run 1, round 1 re-sent
    np.testing.assert_array_equal(again, a)
    assert sum(len(r) for r in entries(nc).values()) == 2
