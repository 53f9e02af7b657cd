"""VerticalADMMStrategy keeps Flower 1.42's Strategy contract: a ServerApp written as Flower's
examples write one runs it, the loop calls the four hooks with Flower's signatures, the
Result holds the run, and the numbers are the in-process engine's, bit for bit."""

import inspect

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result, Strategy

from flower_vfl import VerticalADMM
from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.core.losses import get_loss
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io.data import labels, party_block
from flower_vfl.strategies.vertical_admm import VerticalADMMStrategy

HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}
RC = {"dataset": "breast_cancer", "num-parties": 3, "max-rounds": 12, "lam": 1e-3}
NODES = {100 + i: {"partition-id": i} for i in range(3)}


class CountingStrategy(VerticalADMMStrategy):
    """Records the hooks the loop calls (names and the arguments' types)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def configure_train(self, server_round, arrays, config, grid):
        self.calls.append(("configure_train", server_round, type(arrays), type(config), isinstance(grid, Grid)))
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.calls.append(("aggregate_train", server_round, len(replies)))
        return super().aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round, arrays, config, grid):
        self.calls.append(("configure_evaluate", server_round, type(arrays), type(config), isinstance(grid, Grid)))
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        replies = list(replies)
        self.calls.append(("aggregate_evaluate", server_round, len(replies)))
        return super().aggregate_evaluate(server_round, replies)


RUNS = []
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """A ServerApp as Flower's examples write it."""
    y, y_test = labels(context.run_config["dataset"])
    strategy = CountingStrategy(y, y_test, num_parties=context.run_config["num-parties"], eval_every=4)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=context.run_config["max-rounds"],
                            timeout=60)
    RUNS.append((strategy, result))


def run_app(rc=RC):
    RUNS.clear()
    grid = LocalGrid(HANDLERS, NODES, rc)
    app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=dict(rc)))
    return RUNS[-1]


def engine(rounds):
    blocks = [party_block("breast_cancer", i, 3) for i in range(3)]
    y, y_test = labels("breast_cancer")
    m = VerticalADMM(lam=1e-3, max_rounds=rounds, tol=0).fit([b[0] for b in blocks], y)
    return m, m.decision_function([b[1] for b in blocks]), get_loss("logistic").encode_labels(y_test)


def test_server_app_written_as_flower_examples_gives_the_engines_numbers():
    st, result = run_app()
    m, f, t_test = engine(12)
    assert isinstance(result, Result)
    assert sorted(result.train_metrics_clientapp) == list(range(1, 13))
    for k, row in zip(range(1, 13), m.history_):
        rec = result.train_metrics_clientapp[k]
        for key in ("train_loss", "objective", "primal_residual", "dual_residual", "rho"):
            assert rec[key] == row[key], (k, key)
        assert rec["parties"] == 3 and rec["stale"] == 0
    # evaluations at rounds 4 and 8 (eval_every) and the final one after round 12
    assert sorted(result.evaluate_metrics_clientapp) == [4, 8, 12]
    final = result.evaluate_metrics_clientapp[12]
    assert final["test_loss"] == get_loss("logistic").mean(f, t_test)
    loss = get_loss("logistic")
    assert final["test_accuracy"] == float(np.mean(loss.predict(f) == loss.predict(t_test)))
    assert np.array_equal(st.decision_test_, f)
    assert np.array_equal(result.arrays["intercept"].numpy(), np.atleast_1d(m.intercept_))


def test_the_loop_calls_flowers_four_hooks_with_flowers_arguments():
    st, _ = run_app(dict(RC, **{"max-rounds": 5}))
    names = [c[0] for c in st.calls]
    train, evaluate = ["configure_train", "aggregate_train"], ["configure_evaluate", "aggregate_evaluate"]
    assert names == train * 4 + evaluate + train + evaluate        # eval_every=4, then the final one
    assert [c[1] for c in st.calls if c[0] == "configure_train"] == [1, 2, 3, 4, 5]
    assert all(c[2:] == (ArrayRecord, ConfigRecord, True) for c in st.calls if c[0].startswith("configure"))
    assert all(c[2] == 3 for c in st.calls if c[0].startswith("aggregate"))     # one reply per party


def test_signatures_are_flowers():
    assert issubclass(VerticalADMMStrategy, Strategy)
    for name in ("start", "configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate"):
        ours = list(inspect.signature(getattr(VerticalADMMStrategy, name)).parameters)
        assert ours == list(inspect.signature(getattr(Strategy, name)).parameters), name


@pytest.mark.parametrize("kw, match", [
    ({"initial_arrays": ArrayRecord({"w": Array(np.zeros(3))})},
     r"initial_arrays holds \['w'\]; vertical ADMM has no global model to send .* pass ArrayRecord\(\)"),
    ({"train_config": ConfigRecord({"lr": 0.1})},
     r"train_config holds \['lr'\]; the parties take no settings from the central node .* pass None"),
    ({"evaluate_config": ConfigRecord({"x": 1})}, r"evaluate_config holds \['x'\]"),
    ({"evaluate_fn": lambda k, a: None}, r"evaluate_fn: the central node holds no model to evaluate"),
    ({"num_rounds": 0}, r"num_rounds=0; expected an integer >= 1"),
])
def test_start_refuses_what_vertical_training_cannot_honour_before_any_message(kw, match):
    sent = []
    grid = LocalGrid(HANDLERS, NODES, RC, on_reply=lambda m, r: sent.append(m))
    y, y_test = labels("breast_cancer")
    with pytest.raises(ValueError, match=match):
        VerticalADMMStrategy(y, y_test, num_parties=3).start(grid, **{"initial_arrays": ArrayRecord(), **kw})
    assert sent == []


def test_the_project_server_app_uses_the_same_call(monkeypatch):
    seen = []
    orig = VerticalADMMStrategy.start

    def start(self, *args, **kw):
        seen.append((args, kw))
        return orig(self, *args, **kw)
    monkeypatch.setattr(VerticalADMMStrategy, "start", start)
    rc = {"dataset": "breast_cancer", "num-parties": 3, "max-rounds": 3, "round-timeout": 30.0}
    grid = LocalGrid(HANDLERS, NODES, rc)
    sa.app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    (args, kw), = seen
    assert args == () and sorted(kw) == ["grid", "initial_arrays", "num_rounds", "timeout"]
    assert kw["num_rounds"] == 3 and kw["timeout"] == 30.0 and len(kw["initial_arrays"]) == 0
