"""Vertical SGD through Flower messages (LocalGrid, in process) equals the in-process engine;
run pictures and the shared metric names of both ADMM engines; `flower-vfl report` / `fit --eval-every`."""

import csv
import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.serverapp.strategy import Result

from flower_vfl import VerticalADMM
from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.routes.vertical_sgd.reference import VerticalSGD
from flower_vfl.cli import main as cli
from flower_vfl.routes.vertical_sgd.party import SGD_HANDLERS
from flower_vfl.io.data import labels, party_block
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.reporting.plots import plot_runs, privacy_curves, read_metrics
from flower_vfl.routes.vertical_sgd.central import VerticalSGDStrategy

KW = dict(lr=0.3, lr_schedule="inverse", lr_decay=0.01, batch_size=64, max_epochs=4, init_scale=0.1)


def started(st, grid):
    """``st`` after Flower's ``start(grid, initial_arrays)``, its Result checked against ``st``:
    the intercept, each epoch's history row, its test metrics."""
    res = st.start(grid, ArrayRecord())
    assert isinstance(res, Result)
    assert res.arrays["intercept"].numpy().tolist() == [st.central.b]
    assert sorted(res.train_metrics_clientapp) == [row["round"] for row in st.history_]
    for row in st.history_:
        assert dict(res.train_metrics_clientapp[row["round"]]) == pytest.approx(
            {k: v for k, v in row.items() if not k.startswith("test_")}, rel=0, abs=0)
        test = {k: v for k, v in row.items() if k.startswith("test_")}
        assert dict(res.evaluate_metrics_clientapp.get(row["round"], {})) == pytest.approx(test, rel=0, abs=0)
    return st


def run_sgd_flower(seed=7, on_reply=None, eval_every=1):
    rc = {"dataset": "breast_cancer", "num-parties": 3, "lam": 1e-2}
    grid = LocalGrid(SGD_HANDLERS, {100 + i: {"partition-id": i} for i in range(3)}, rc, on_reply=on_reply)
    y, yt = labels("breast_cancer")
    return started(VerticalSGDStrategy(y, yt, num_parties=3, seed=seed, eval_every=eval_every, **KW), grid)


def test_flower_sgd_equals_the_engine():
    st = run_sgd_flower()
    B = [party_block("breast_cancer", i, 3) for i in range(3)]
    y, yt = labels("breast_cancer")
    m = VerticalSGD(lam=1e-2, random_state=7, **KW).fit([b[0] for b in B], y, eval_set=([b[1] for b in B], yt))
    np.testing.assert_allclose(st.decision_test_, m.decision_function([b[1] for b in B]), rtol=0, atol=1e-12)
    for a, b in zip(st.history_, m.history_):
        for key in ("round", "steps", "messages", "bytes", "lr", "objective", "train_loss", "test_loss",
                    "test_accuracy"):
            assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-15), key


def test_flower_sgd_messages_carry_only_batch_vectors_and_a_resent_message_is_not_applied_twice():
    seen = []
    st = run_sgd_flower(on_reply=lambda msg, rep: seen.append((msg, rep)), eval_every=0)
    n = labels("breast_cancer")[0].size
    train = [(m, r) for m, r in seen if m.metadata.message_type == "train"]
    assert len(train) == 3 * st.steps_
    for _, rep in train:
        s = rep.content.array_records["release"]["s"].numpy()
        assert s.shape[0] <= 64 < n                       # one batch of predictions, never an N-vector
    # re-deliver the last train message to its party: same reply, x unchanged (no double step)
    msg, rep = train[-1]
    ctx_grid = LocalGrid(SGD_HANDLERS, {msg.metadata.dst_node_id: {"partition-id": 2}},
                         {"dataset": "breast_cancer", "num-parties": 3, "lam": 1e-2})
    ctx = ctx_grid.contexts[msg.metadata.dst_node_id]
    first = SGD_HANDLERS["train"](msg, ctx)
    x1 = ctx.state["vfl.sgd"]["x"].numpy().copy()
    again = SGD_HANDLERS["train"](Message(msg.content, dst_node_id=msg.metadata.dst_node_id, message_type="train"), ctx)
    np.testing.assert_array_equal(first.content.array_records["release"]["s"].numpy(),
                                  again.content.array_records["release"]["s"].numpy())
    np.testing.assert_array_equal(x1, ctx.state["vfl.sgd"]["x"].numpy())


def test_sgd_start_keeps_flowers_contract():
    """num_rounds sets the epochs; what the label owner cannot send or run is refused, naming the fix."""
    rc = {"dataset": "breast_cancer", "num-parties": 3, "lam": 1e-2}
    y, yt = labels("breast_cancer")
    grid = LocalGrid(SGD_HANDLERS, {100 + i: {"partition-id": i} for i in range(3)}, rc)
    st = VerticalSGDStrategy(y, yt, num_parties=3, seed=7, **KW)
    res = st.start(grid, ArrayRecord(), num_rounds=2)
    assert sorted(res.train_metrics_clientapp) == [1, 2] and st.final_["rounds"] == 2
    ref = run_sgd_flower()                                     # the first 2 of 4 epochs are the same
    assert st.history_[1]["objective"] == ref.history_[1]["objective"]
    with pytest.raises(ValueError, match=r"^initial_arrays holds \['x'\]; vertical SGD has no global model to "
                                         r"send \(each party draws its own x_m from the seed\): pass ArrayRecord\(\)$"):
        VerticalSGDStrategy(y, num_parties=3).start(grid, ArrayRecord({"x": Array(ref.decision_test_)}))
    with pytest.raises(ValueError, match=r"^evaluate_config holds \['a'\]; the parties take no settings"):
        VerticalSGDStrategy(y, num_parties=3).start(grid, ArrayRecord(), evaluate_config=ConfigRecord({"a": 1}))
    with pytest.raises(ValueError, match=r"^evaluate_fn: the label owner holds no model to evaluate"):
        VerticalSGDStrategy(y, num_parties=3).start(grid, ArrayRecord(), evaluate_fn=lambda t, a: None)


def test_the_old_import_paths_are_the_route_folders_objects():
    from flower_vfl import baselines
    from flower_vfl.baselines import sgd
    from flower_vfl.clients import VerticalSGDPartyClient
    from flower_vfl.clients import vertical_sgd as old_party
    from flower_vfl.routes.vertical_sgd import party, reference
    from flower_vfl.strategies import VerticalSGDStrategy as Old
    assert Old is VerticalSGDStrategy and VerticalSGDPartyClient is party.VerticalSGDPartyClient
    assert old_party.SGD_HANDLERS is SGD_HANDLERS and baselines.VerticalSGD is sgd.VerticalSGD is VerticalSGD
    assert sgd.init_coef is reference.init_coef


def test_sgd_party_refuses_misaligned_rows():
    rc = {"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-2}
    grid = LocalGrid(SGD_HANDLERS, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc)
    y, _ = labels("breast_cancer")
    with pytest.raises(ValueError, match=r"party 0 \(node 100\) holds 426 rows but the labels have 425; "
                                         r"the parties' samples are not aligned"):
        started(VerticalSGDStrategy(y[:-1], num_parties=2), grid)


# --------------------------------------------------------------- metric names and pictures

def test_both_admm_engines_write_objective_and_train_loss():
    rc = {"dataset": "breast_cancer", "num-parties": 3, "max-rounds": 8}
    grid = LocalGrid({"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify},
                     {100 + i: {"partition-id": i} for i in range(3)}, rc)
    st = sa.make_strategy(rc)
    st.start(grid)
    B = [party_block("breast_cancer", i, 3)[0] for i in range(3)]
    m = VerticalADMM(lam=1e-4, max_rounds=8, tol=0).fit(B, labels("breast_cancer")[0])
    for a, b in zip(st.history_, m.history_):
        assert a["objective"] == pytest.approx(b["objective"], rel=1e-9)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9)
        assert b["objective"] > b["train_loss"]             # lam R(x) > 0 once x moves


def test_fit_eval_every_report_and_overlay(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(["fit", "--dataset", "breast_cancer", "--num-parties", "2", "--max-rounds", "10",
                "--eval-every", "5", "--out-dir", str(a)]) == 0
    assert cli(["fit", "--dataset", "breast_cancer", "--num-parties", "3", "--max-rounds", "6",
                "--out-dir", str(b)]) == 0
    rows = list(csv.DictReader(open(a / "metrics.csv")))
    assert [r["round"] for r in rows if r["test_loss"]] == ["5", "10"]
    assert {"objective", "train_loss", "primal_residual", "dual_residual"} <= set(rows[0])
    final = json.loads((a / "report.json").read_text())["final"]
    assert float(rows[-1]["test_loss"]) == pytest.approx(final["test_loss"], rel=1e-12)
    assert (a / "run.png").stat().st_size > 10_000 and (b / "run.png").stat().st_size > 10_000
    assert read_metrics(a)["objective"][-1] == pytest.approx(float(rows[-1]["objective"]), rel=1e-15)
    out = tmp_path / "both.png"
    assert cli(["report", str(a), str(b), "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000
    assert f"wrote {out}" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match=r"metrics.csv not found; RUN_DIR must be a folder written by"):
        plot_runs([tmp_path / "nowhere"], tmp_path / "x.png")


@pytest.mark.slow
def test_privacy_curve_ends_at_the_partys_own_total():
    from flower_vfl.privacy.party import PrivacyConfig
    B = [party_block("breast_cancer", i, 2) for i in range(2)]
    y, _ = labels("breast_cancer")
    cfg = PrivacyConfig(epsilon=2.0, train_rounds=2, seed=1)
    m = VerticalADMM(lam=1e-4, max_rounds=5, tol=0, privacy=[None, cfg]).fit([b[0] for b in B], y)
    rep = json.loads(json.dumps(m.privacy_report(), default=float))
    curves = privacy_curves({"privacy": rep})
    (label, (rounds, eps)), = curves.items()
    assert rounds[0] == 0 and eps[0] == 0.0 and eps == sorted(eps)
    assert eps[-1] == pytest.approx(rep[0]["totals"][cfg.accountant], rel=1e-9)
    assert eps[-1] <= cfg.epsilon * (1 + 1e-9)


def test_server_app_writes_the_run_picture(tmp_path):
    from flwr.app import Context, RecordDict
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 6, "out-dir": str(tmp_path), "eval-every": 2}
    grid = LocalGrid({"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify},
                     {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc)
    sa.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    assert (tmp_path / "run.png").stat().st_size > 10_000
    cols = read_metrics(tmp_path)
    assert all(o > t for o, t in zip(cols["objective"], cols["train_loss"]))
    assert [r for r, v in zip(cols["round"], cols["test_loss"]) if v == v] == [2.0, 4.0, 6.0]


def test_sgd_node_without_partition_id_is_refused_naming_the_fix():
    grid = LocalGrid(SGD_HANDLERS, {100: {}}, {"dataset": "breast_cancer", "num-parties": 1})
    y, _ = labels("breast_cancer")
    from flower_vfl.strategies.exchange import PartyFailed
    with pytest.raises(PartyFailed, match=r"node 100 failed in the identify query: ValueError: .*node config has "
                                          r"no partition-id: start it with --node-config"):
        started(VerticalSGDStrategy(y, num_parties=1), grid)


def test_the_route_registry_builds_the_sgd_clientapp_and_refuses_clashes():
    """The vertical-sgd route's ClientApp comes from the registry (its folder's handlers) and runs the
    same trajectory as the handlers called directly; two routes of one app cannot claim one message
    type; an unknown route is named with the registered ones."""
    from flower_vfl import routes
    from flower_vfl.routes.route import Route
    app = routes.client_app("vertical-sgd")
    rc = {"dataset": "breast_cancer", "num-parties": 3, "lam": 1e-2}
    handlers = {m: (lambda msg, ctx: app(msg, ctx)) for m in routes.get("vertical-sgd").messages}
    y, yt = labels("breast_cancer")
    st = started(VerticalSGDStrategy(y, yt, num_parties=3, seed=7, **KW),
                 LocalGrid(handlers, {100 + i: {"partition-id": i} for i in range(3)}, rc))
    ref = run_sgd_flower()
    assert [r["objective"] for r in st.history_] == [r["objective"] for r in ref.history_]
    np.testing.assert_array_equal(st.decision_test_, ref.decision_test_)
    twin = Route("twin", "", "vertical", "m:C", "m:P", "m:R", ("query.ssp_release",))
    with pytest.raises(ValueError, match=r"^routes 'stacked-ssp' and 'twin' of the vertical app both claim the "
                                         r"message type 'query.ssp_release'$"):
        routes._check((*routes.REGISTRY, twin))
    with pytest.raises(KeyError, match=r"no route 'sgd'; the registered routes are admm, horizontal-dpiadmm, "
                                       r"moment, stacked-ssp, vertical-sgd"):
        routes.get("sgd")
    with pytest.raises(ValueError, match=r"^route 'admm' is served by the vertical app, not by handlers of its own$"):
        routes.client_app("admm")
