"""Vertical SGD through Flower messages (LocalGrid, in process) equals the in-process engine;
run pictures and the shared metric names of both ADMM engines; `flower-vfl report` / `fit --eval-every`."""

import csv
import json

import numpy as np
import pytest
from flwr.app import Message

from flower_vfl import VerticalADMM
from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.baselines import VerticalSGD
from flower_vfl.cli import main as cli
from flower_vfl.clients.vertical_sgd import SGD_HANDLERS
from flower_vfl.io.data import labels, party_block
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.reporting.plots import plot_runs, privacy_curves, read_metrics
from flower_vfl.strategies import VerticalSGDStrategy

KW = dict(lr=0.3, lr_schedule="inverse", lr_decay=0.01, batch_size=64, max_epochs=4, init_scale=0.1)


def run_sgd_flower(seed=7, on_reply=None, eval_every=1):
    rc = {"dataset": "breast_cancer", "num-parties": 3, "lam": 1e-2}
    grid = LocalGrid(SGD_HANDLERS, {100 + i: {"partition-id": i} for i in range(3)}, rc, on_reply=on_reply)
    y, yt = labels("breast_cancer")
    return VerticalSGDStrategy(y, yt, num_parties=3, seed=seed, eval_every=eval_every, **KW).start(grid)


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


def test_sgd_party_refuses_misaligned_rows():
    rc = {"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-2}
    grid = LocalGrid(SGD_HANDLERS, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc)
    y, _ = labels("breast_cancer")
    with pytest.raises(ValueError, match=r"party 0 \(node 100\) holds 426 rows but the labels have 425; "
                                         r"the parties' samples are not aligned"):
        VerticalSGDStrategy(y[:-1], num_parties=2).start(grid)


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
        VerticalSGDStrategy(y, num_parties=1).start(grid)
