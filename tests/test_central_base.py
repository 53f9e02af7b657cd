"""The one central base (flower_vfl/strategies/base.py): every registered route's central node is a
``CentralBase`` and keeps Flower's ``start(grid, initial_arrays, num_rounds, timeout, train_config,
evaluate_config, evaluate_fn) -> Result`` contract, written once there.

- the registry: each route's central node (the vertical ADMM one too) subclasses ``CentralBase`` and
  does not override ``start``;
- numbers: the vertical SGD route's Result equals its in-process reference
  (``routes/vertical_sgd/reference.py``: intercept, every epoch's metrics); the horizontal route's
  Result w equals the in-process engine's and ``evaluate_fn`` sees every round's w; a second
  ``start`` on the same object is a new run (its state is fresh: the same numbers again, not a
  continuation);
- refusals: what a route cannot honour is refused, with the exact message, before any message is
  sent (``grid=None`` is never touched); a stop (``STOPS``) is recorded in the report and raised
  again. In process (LocalGrid, the real handlers); about 10 s.
"""

import inspect

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp.strategy import Result, Strategy

from flower_vfl import routes
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io.data import labels, party_block
from flower_vfl.routes.vertical_sgd.central import VerticalSGDStrategy
from flower_vfl.routes.vertical_sgd.party import SGD_HANDLERS
from flower_vfl.routes.vertical_sgd.reference import VerticalSGD
from flower_vfl.strategies.base import CentralBase, RunState
from flower_vfl.strategies.dpiadmm import DPIADMMStrategy
from flower_vfl.strategies.moment import MomentStrategy
from flower_vfl.strategies.stacked_ssp import StackedSSPStrategy

#: routes whose central node is not on the base yet: none
NOT_YET = set()
KW = dict(lr=0.3, lr_schedule="inverse", lr_decay=0.01, batch_size=64, max_epochs=3, init_scale=0.1)


def test_every_registered_routes_central_node_is_a_central_base_with_flowers_start():
    off = set()
    for name, route in routes.routes().items():
        cls = route.load("central")
        assert issubclass(cls, Strategy), name
        if not issubclass(cls, CentralBase):
            off.add(name)
            continue
        assert cls.start is CentralBase.start, name            # the contract is written once
        assert issubclass(cls.State, RunState), name
    assert off == NOT_YET
    assert list(inspect.signature(CentralBase.start).parameters) == list(inspect.signature(Strategy.start).parameters)


def sgd_run(seed=7):
    rc = {"dataset": "breast_cancer", "num-parties": 3, "lam": 1e-2}
    grid = LocalGrid(SGD_HANDLERS, {100 + i: {"partition-id": i} for i in range(3)}, rc)
    y, yt = labels("breast_cancer")
    return grid, VerticalSGDStrategy(y, yt, num_parties=3, seed=seed, **KW)


def test_sgd_result_equals_its_in_process_reference_and_a_second_start_is_a_new_run():
    grid, st = sgd_run()
    res = st.start(grid, ArrayRecord(), num_rounds=2)
    B = [party_block("breast_cancer", i, 3) for i in range(3)]
    y, yt = labels("breast_cancer")
    ref = VerticalSGD(lam=1e-2, random_state=7, **dict(KW, max_epochs=2)).fit([b[0] for b in B], y,
                                                                              eval_set=([b[1] for b in B], yt))
    assert isinstance(res, Result)
    assert res.arrays["intercept"].numpy().tolist() == [ref.intercept_]
    assert sorted(res.train_metrics_clientapp) == [1, 2] and sorted(res.evaluate_metrics_clientapp) == [1, 2]
    for k, row in zip((1, 2), ref.history_):
        rec = res.train_metrics_clientapp[k]
        for key in ("steps", "messages", "bytes", "lr", "objective", "train_loss"):
            assert rec[key] == pytest.approx(row[key], rel=1e-12, abs=1e-15), (k, key)
        assert res.evaluate_metrics_clientapp[k]["test_loss"] == pytest.approx(row["test_loss"], rel=1e-12)
    assert st.final_["rounds"] == 2 and st.final_["intercept"] == ref.intercept_
    first = (res.arrays["intercept"].numpy().copy(), [dict(r) for r in st.history_], st.steps_)
    # the same object, a fresh deployment: a new run from its own fresh state, the same numbers
    grid2, _ = sgd_run()
    res2 = st.start(grid2, ArrayRecord(), num_rounds=2)
    np.testing.assert_array_equal(res2.arrays["intercept"].numpy(), first[0])
    assert st.steps_ == first[2] and len(st.history_) == 2
    for a, b in zip(st.history_, first[1]):
        assert {k: v for k, v in a.items() if k != "elapsed_s"} == {k: v for k, v in b.items() if k != "elapsed_s"}


@pytest.mark.parametrize("make, kw, match", [
    (lambda: sgd_run()[1], dict(num_rounds=0), r"^num_rounds=0; expected an integer >= 1 \(epochs\)$"),
    (lambda: sgd_run()[1], dict(initial_arrays=ArrayRecord({"x": Array(np.zeros(2))})),
     r"^initial_arrays holds \['x'\]; vertical SGD has no global model to send"),
    (lambda: DPIADMMStrategy("objt", 2, 3, 2, 4), dict(num_rounds=True),
     r"^num_rounds=True; expected an integer >= 1 \(iterations T\)$"),
    (lambda: DPIADMMStrategy("objt", 2, 3, 2, 4), dict(evaluate_config=ConfigRecord({"a": 1})),
     r"^evaluate_config holds \['a'\]; an agent takes only the protocol's t, rho_t"),
    (lambda: StackedSSPStrategy(np.array([0, 1, 1, 0])), dict(evaluate_fn=lambda t, a: None),
     r"^evaluate_fn: the central node holds no model to evaluate"),
    (lambda: MomentStrategy(np.array([0, 1, 1, 0])), dict(train_config=ConfigRecord({"lr": 0.1})),
     r"^train_config holds \['lr'\]; the parties take no settings from the central node"),
])
def test_what_a_route_cannot_honour_is_refused_before_any_message(make, kw, match):
    st = make()
    with pytest.raises(ValueError, match=match):
        st.start(None, **kw)                       # grid=None: never touched
    assert st.history_ == [] and st.final_ == {} and st.exchange is None


def test_horizontal_result_equals_the_engine_and_evaluate_fn_sees_every_rounds_w():
    from sklearn.datasets import load_digits

    from flower_vfl.clients import DPIADMMClient
    from flower_vfl.clients.dpiadmm import agent_privacy_from_node_config
    from flower_vfl.horizontal import DPIADMMParams, run_dpiadmm
    from flower_vfl.horizontal.data import split_arrays
    P, K, T = 3, 3, 6
    X, y = load_digits(return_X_y=True)
    keep = y < K
    Xp, yp = split_arrays(X[keep][:300] / 16.0, y[keep][:300], P, "iid")
    clients = {}

    def client(ctx):
        pid = int(ctx.node_config["partition-id"])
        if pid not in clients:
            clients[pid] = DPIADMMClient(pid, Xp[pid], yp[pid], K, agent_privacy_from_node_config(ctx.node_config))
        return clients[pid]
    grid = LocalGrid({"train": lambda m, c: client(c).train(m, c), "query.identify": lambda m, c: client(c).identify(m, c)},
                     {100 + i: {"partition-id": i} for i in range(P)})
    seen = {}

    def evaluate_fn(t, arrays):
        seen[t] = arrays["w"].numpy().copy()
        return MetricRecord({"w_l1": float(np.abs(seen[t]).sum())})

    st = DPIADMMStrategy("objt", P, Xp[0].shape[1], K, 50, beta=1e-4)
    res = st.start(grid, ArrayRecord(), num_rounds=T, evaluate_fn=evaluate_fn)
    ref = run_dpiadmm(Xp, yp, DPIADMMParams(variant="objt", eps_bar=None, beta=1e-4), T, [[1, 2, 3]], K=K, stream=1)
    assert np.max(np.abs(res.arrays["w"].numpy() - ref.W[0])) <= 1e-9
    np.testing.assert_array_equal(seen[T], res.arrays["w"].numpy())
    assert sorted(seen) == list(range(1, T + 1)) == sorted(res.train_metrics_clientapp)
    assert res.evaluate_metrics_serverapp[T]["w_l1"] == float(np.abs(res.arrays["w"].numpy()).sum())
    assert st.final_["rounds"] == T and st.stopped_reason_ is None


def test_a_stop_is_recorded_in_the_report_and_raised_again(tmp_path):
    """A non-private party refuses the one-release route at identify: the run fails (no Result),
    its report says why."""
    from flower_vfl.apps import client as ca
    from flower_vfl.strategies.exchange import PartyRefused
    y, yt = labels("breast_cancer")
    rc = {"dataset": "breast_cancer", "num-parties": 2, "route": "stacked-ssp", "party-wait": 0.0}
    grid = LocalGrid({"query.ssp_identify": ca.ssp_identify, "query.ssp_release": ca.ssp_release},
                     {100 + m: {"partition-id": m, "state-dir": str(tmp_path / f"p{m}")} for m in range(2)}, rc)
    st = StackedSSPStrategy(y, yt, num_parties=2, party_wait=0.0)
    with pytest.raises(PartyRefused, match=r"^party 0 \(node 100\) is not private: the stacked SSP route needs "
                                           r"every party private"):
        st.start(grid, ArrayRecord(), timeout=60)
    assert st.failed_ and st.final_["failed"] is True and st.final_["route"] == "stacked-ssp"
    assert st.final_["stopped_reason"] == st.stopped_reason_ and st.final_["rounds"] == 0
