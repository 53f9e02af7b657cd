"""Own data end to end through the Flower path (in process): PSI alignment, training, the
owners' model files, a predict job; the engine on the aligned intersection is the reference."""

import csv

import numpy as np
import pytest

from _own_data_helpers import (node_configs, reference, run_config, run_predict, run_train,
                               write_a9a_files)
from flower_vfl.io import model_files as model_io
from flower_vfl.io.data import load_all


@pytest.fixture(scope="module")
def a9a_small():
    X, y, Xt, _ = load_all("a9a")
    return X[:800], y[:800], Xt[:300]


@pytest.mark.parametrize("fmt", ["csv", "parquet", "libsvm"])
def test_own_data_train_save_predict_equals_engine(tmp_path, a9a_small, fmt):
    """a9a as three files (label owner 1-40 with the labels, parties 41-80 and 81-123), rows
    shuffled per file, 5 % missing at party 1, extra rows at party 2; a9a.t scored from a
    fourth shuffled file. Scores equal the engine fitted on the aligned intersection."""
    train, score = write_a9a_files(tmp_path, *a9a_small, fmt=fmt)
    nodes = node_configs(train, score, fmt, tmp_path)
    rc = run_config(train, score, tmp_path)
    st, _ = run_train(rc, nodes)
    model, order, sorder, f_ref = reference(nodes, rc)
    assert st.central.n == len(order) == round(0.95 * 800)            # the 5 % rows dropped at party 1
    al = st.alignment_
    assert [str(i) for i in np.asarray(_owner_ids(train[0], fmt))[al.order]] == [str(i) for i in order]
    res = run_predict(rc, nodes)
    assert res["n_requested"] == 300 and res["ids"] == [str(i) for i in sorder]
    assert np.max(np.abs(res["scores"] - f_ref)) <= 1e-9
    np.testing.assert_array_equal(res["labels"], model.predict(_blocks(nodes, sorder, "score")))
    # the predictions file says the same, row for row
    with open(res["path"]) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"] for r in rows] == res["ids"]
    np.testing.assert_allclose([float(r["score"]) for r in rows], f_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose([float(r["probability"]) for r in rows], 1 / (1 + np.exp(-f_ref)), atol=1e-12)


def _owner_ids(path, fmt):
    from flower_vfl.io import read_party, source_from_config
    return read_party(source_from_config({"data-path": str(path), "label-column": "label"})).ids


def _blocks(nodes, order, split):
    from _own_data_helpers import _rows
    from flower_vfl.io import read_party, source_from_config
    tabs = [read_party(source_from_config(nodes[100 + m], split)) for m in range(3)]
    return [t.X[_rows(t, order)] for t in tabs]


def test_model_files_hold_each_owners_part_and_no_training_rows(tmp_path, a9a_small):
    train, score = write_a9a_files(tmp_path, *a9a_small, fmt="csv")
    nodes = node_configs(train, score, "csv", tmp_path)
    rc = run_config(train, score, tmp_path)
    st, _ = run_train(rc, nodes)
    model, order, _, _ = reference(nodes, rc)
    for m in range(3):
        saved = model_io.load_model(tmp_path / f"models-party{m}" / f"party-{m}.npz")
        meta = saved["meta"]
        assert meta["format"] == "flower-vfl-model" and meta["version"] == model_io.VERSION
        assert meta["kind"] == "party" and meta["party"] == m and meta["n_rows"] == len(order)
        assert meta["columns"] == [f"f{j + 1}" for j in range(*[(0, 40), (40, 80), (80, 123)][m])]
        np.testing.assert_allclose(saved["x"], model.coef_[m], rtol=0, atol=1e-9)
        assert set(saved) == {"meta", "x"}                      # x_m only: no block, no IDs
        D = _blocks(nodes, order, "train")[m]
        assert meta["fingerprint"] == model_io.data_fingerprint(D, order)
    owner = model_io.load_model(tmp_path / "owner" / "label-owner.npz")
    assert owner["meta"]["kind"] == "label-owner" and owner["meta"]["classes"] == [-1, 1]
    assert float(owner["intercept"]) == pytest.approx(float(model.intercept_), abs=1e-9)
    assert len(owner["meta"]["history"]) == rc["max-rounds"] == len(model.history_)
    desc = model_io.describe(tmp_path / "models-party1" / "party-1.npz")
    assert desc["x_shape"] == [40] and desc["n_columns"] == 40 and "history" not in desc


def test_server_view_holds_no_id_outside_the_intersection(tmp_path, a9a_small):
    """Every message the strategy receives: only encrypted sets, counts and digests; no
    plaintext ID at all (so in particular none outside the intersection)."""
    train, score = write_a9a_files(tmp_path, *a9a_small, fmt="csv")
    nodes = node_configs(train, score, "csv", tmp_path)
    rc = run_config(train, score, tmp_path)
    seen = []
    run_train(rc, nodes, on_reply=lambda msg, rep: seen.append(rep))
    run_predict(rc, nodes, on_reply=lambda msg, rep: seen.append(rep))
    from flower_vfl.io import read_party, source_from_config
    party_ids = set()
    for m in range(3):
        for split in ("train", "score"):
            party_ids |= set(read_party(source_from_config(nodes[100 + m], split)).ids.tolist())
    assert any(i.startswith("10000") for i in party_ids)                # party 2's extra rows exist
    blobs = []
    for rep in seen:
        for rec in list(rep.content.config_records.values()) + list(rep.content.metric_records.values()):
            for v in rec.values():
                blobs.append(v if isinstance(v, bytes) else str(v).encode())
    assert any(len(b) > 1000 for b in blobs)                            # the encrypted sets were seen
    # IDs are 'u000123', 't000123' and '10000012' (7-8 bytes): none appears in plaintext. A whole
    # ID is searched, not a 3-byte prefix: random ciphertext holds a given 3-byte string about once
    # in 16 MB, so a prefix test failed by chance; a given 7-byte string, about once in 2^56 bytes
    for b in blobs:
        assert not [i for i in party_ids if i.encode() in b]
    # no part of a party's model reaches the server: saving answers with an acknowledgement,
    # and no array the server receives has a block's width (40, 40, 43) — only N-vectors
    saved = [rep for rep in seen if "saved" in rep.content]
    assert len(saved) == 3 and all(set(rep.content.keys()) == {"saved"} for rep in saved)
    for rep in seen:
        for rec in rep.content.array_records.values():
            assert all(rec[k].numpy().shape[0] not in (40, 43) for k in rec)


def test_no_common_ids_and_too_few_common_rows(tmp_path):
    from flower_vfl.io.bundled import write_table
    rng = np.random.default_rng(0)
    X = rng.standard_normal((6, 3))
    y = np.array([0, 1, 0, 1, 0, 1])
    lo = write_table(tmp_path / "lo.csv", [f"a{i}" for i in range(6)], X[:, :1], ["f1"], "csv", y=y)
    p1 = write_table(tmp_path / "p1.csv", [f"b{i}" for i in range(6)], X[:, 1:], ["f2", "f3"], "csv")
    p1b = write_table(tmp_path / "p1b.csv", ["a0", "b1"], X[:2, 1:], ["f2", "f3"], "csv")
    nodes = {100: {"partition-id": 0, "data-path": str(lo), "label-column": "label"},
             101: {"partition-id": 1, "data-path": str(p1)}}
    rc = {"num-parties": 2, "max-rounds": 2, "labels-path": str(lo), "label-column": "label",
          "model-dir": str(tmp_path / "o")}
    from flower_vfl.io.psi import AlignmentError
    with pytest.raises(AlignmentError, match=r"party 1 has no training ID in common with the label owner's 6 "
                                             r"rows; check that both exports use the same ID column"):
        run_train(rc, nodes)
    nodes[101].update({"data-path": str(p1b), "psi-max-asked": 3.0})   # asked about 6 IDs, holds 2
    with pytest.raises(AlignmentError, match=r"only 1 training ID\(s\) are common to the label owner and all 2 "
                                             r"parties \(pairwise: \{0: 6, 1: 1\}\); at least 2 are needed"):
        run_train(rc, nodes)


def test_bad_party_file_stops_the_run_naming_the_node_and_file(tmp_path, a9a_small):
    train, score = write_a9a_files(tmp_path, *a9a_small, fmt="csv")
    nodes = node_configs(train, score, "csv", tmp_path)
    nodes[102]["data-path"] = str(tmp_path / "missing.csv")
    rc = run_config(train, score, tmp_path)
    with pytest.raises(RuntimeError, match=r"node 102 failed in the PSI answer step for split 'train': DataError: "
                                           r"the data file .*missing.csv does not exist; fix the node-config key "
                                           r"data-path"):
        run_train(rc, nodes)
    nodes = node_configs(train, score, "csv", tmp_path)
    nodes[101]["data-path"] = str(train[0])          # a party pointed at the label owner's file
    with pytest.raises(RuntimeError, match=r"node 101 failed in the PSI answer step .* holds the label column "
                                           r"'label' but this node is not the label owner"):
        run_train(rc, nodes)


def test_predict_with_a_missing_party_names_it(tmp_path, a9a_small):
    train, score = write_a9a_files(tmp_path, *a9a_small, fmt="csv")
    nodes = node_configs(train, score, "csv", tmp_path)
    rc = run_config(train, score, tmp_path)
    run_train(rc, nodes)
    del nodes[102]
    with pytest.raises(RuntimeError, match=r"parties \[2\] did not answer the PSI answer step for split 'score' "
                                           r"within party-wait=0.2 s \(nodes seen: \[100, 101\]\)"):
        run_predict({**rc, "party-wait": 0.2}, nodes)
    nodes = node_configs(train, score, "csv", tmp_path, extra={2: {"model-dir": str(tmp_path / "elsewhere")}})
    with pytest.raises(RuntimeError, match=r"party 2 \(node 102\) failed in the predict request \(Flower error 2\): ModelFileError: model file "
                                           r".*elsewhere/party-2.npz does not exist"):
        run_predict(rc, nodes)


def test_private_party_saves_its_released_x_tilde_and_scores_from_it(tmp_path, a9a_small):
    """Party 2 private (ε = 1, noise from OS entropy: a party never takes a seed): its model
    file holds only the released x̃ (one ledger entry, the evaluation release); the predict job
    scores from the saved blocks, D_m x_m (x̃ on normalized rows for the private party) plus the
    label owner's intercept, to 1e-9."""
    from _own_data_helpers import RANGES

    from flower_vfl.core.scoring import party_scores
    from flower_vfl.io.bundled import write_party_files
    X, y, Xt = a9a_small
    yt = load_all("a9a")[3][:Xt.shape[0]]
    train, score = write_a9a_files(tmp_path, X, y, Xt, "csv")
    test = write_party_files(Xt, yt, [f"t{i:06d}" for i in range(Xt.shape[0])], RANGES, tmp_path, "csv",
                             seed=5, prefix="test")
    priv = {"dp": True, "dp-epsilon": 1.0, "dp-lam": 3e-3, "state-dir": str(tmp_path / "p2")}
    extra = {m: {"test-path": str(test[m])} for m in range(3)}
    extra[2].update(priv)
    nodes = node_configs(train, score, "csv", tmp_path, extra=extra)
    rc = run_config(train, score, tmp_path, **{"labels-test-path": str(test[0])})
    st, _ = run_train(rc, nodes)
    assert [e["kind"] for e in st.privacy_[2]["ledger"]["entries"]] == ["eval"]
    _, _, sorder, _ = reference(nodes, rc)
    models = [model_io.load_model(tmp_path / f"models-party{m}" / f"party-{m}.npz") for m in range(3)]
    assert models[2]["meta"]["private"] and models[2]["meta"]["x_kind"] == "released x_tilde"
    assert not models[0]["meta"]["private"] and not models[1]["meta"]["private"]
    owner = model_io.load_model(tmp_path / "owner" / "label-owner.npz")
    blocks = _blocks(nodes, sorder, "score")
    f = float(np.ravel(owner["intercept"])[0]) + sum(
        party_scores(blocks[m], models[m]["x"], private=bool(models[m]["meta"]["private"])) for m in range(3))
    res = run_predict(rc, nodes)
    assert res["ids"] == [str(i) for i in sorder]
    assert np.max(np.abs(res["scores"] - f)) <= 1e-9


def test_cli_fit_on_party_files_and_model_show(tmp_path, a9a_small, capsys):
    """`flower-vfl fit --labels ... --party ... --party ...` (in process, aligned on the common
    IDs) saves the estimator; `flower-vfl model show` prints its metadata."""
    import json

    from flower_vfl import VerticalADMM
    from flower_vfl.cli.commands import main
    train, score = write_a9a_files(tmp_path, *a9a_small, fmt="parquet")
    nodes = node_configs(train, score, "parquet", tmp_path)
    rc = {"lam": 1e-3, "max-rounds": 15}
    assert main(["fit", "--labels", str(train[0]), "--party", str(train[1]), "--party", str(train[2]),
                 "--lam", "1e-3", "--max-rounds", "15", "--out-dir", str(tmp_path / "out")]) == 0
    printed = json.loads([ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")][0])
    model, order, sorder, f_ref = reference(nodes, rc)
    assert printed["n_aligned"] == len(order) and printed["widths"] == [40, 40, 43]
    loaded = VerticalADMM.load(tmp_path / "out" / "model.npz")
    assert np.max(np.abs(loaded.decision_function(_blocks(nodes, sorder, "score")) - f_ref)) <= 1e-9
    assert main(["model", "show", str(tmp_path / "out" / "model.npz")]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["kind"] == "estimator" and shown["n_features_in"] == [40, 40, 43] and shown["rounds"] == 15


def test_docs_example_of_plugging_the_classes_into_an_existing_flower_app(tmp_path, a9a_small):
    """The code in docs/own-data.md ("Plugging the Flower classes into an existing Flower app"),
    run as written: PSI alignment, then the strategy; same intercept as the engine."""
    import re
    from pathlib import Path

    from flower_vfl.io import read_party, source_from_config
    from flower_vfl.io.bundled import write_party_files
    from flower_vfl.deploy.local_grid import LocalGrid
    from flwr.app import Context, RecordDict
    doc = (Path(__file__).resolve().parents[1] / "docs" / "own-data.md").read_text()
    code = re.search(r"## Plugging the Flower classes.*?```python\n(.*?)```", doc, re.S).group(1)
    server_src, client_src = code.split("\n# client_app.py")
    client_src = client_src.split("\n", 1)[1]
    X, y, _ = a9a_small
    files = write_party_files(X, y, [f"u{i}" for i in range(X.shape[0])], [(0, 60), (60, 123)], tmp_path, "csv",
                              seed=1, missing={1: 0.1})
    owner = read_party(source_from_config({"data-path": str(files[0]), "label-column": "label"}))
    server_ns = {"load_my_labels": lambda: (owner.ids, owner.y)}
    exec(server_src, server_ns)
    client_ns = {}
    exec(client_src, client_ns)
    handlers = {"query.psi_answer": client_ns["psi_party"].psi_answer,
                "query.psi_order": client_ns["psi_party"].psi_order,
                "query.identify": client_ns["identify"], "train": client_ns["train"],
                "evaluate": client_ns["evaluate"]}
    nodes = {100: {"partition-id": 0, "data-path": str(files[0]), "label-column": "label"},
             101: {"partition-id": 1, "data-path": str(files[1]), "psi-max-asked": 1.2}}   # holds 90 %
    grid = LocalGrid(handlers, nodes, {})
    captured = {}
    orig = server_ns["VerticalADMMStrategy"].start

    def start(self, grid, **kw):
        captured["strategy"] = self
        return orig(self, grid, **kw)
    server_ns["VerticalADMMStrategy"].start = start
    try:
        server_ns["main"](grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    finally:
        server_ns["VerticalADMMStrategy"].start = orig
    st = captured["strategy"]
    tabs = [read_party(source_from_config(nodes[100 + m])) for m in range(2)]
    order = [i for i in owner.ids if i in set(tabs[1].ids)]
    from _own_data_helpers import _rows
    from flower_vfl import VerticalADMM
    model = VerticalADMM(max_rounds=50, tol=0).fit([t.X[_rows(t, order)] for t in tabs], owner.y[_rows(owner, order)])
    assert st.central.n == len(order) == round(0.9 * X.shape[0])
    assert float(st.central.b) == pytest.approx(float(model.intercept_), abs=1e-9)


def test_own_data_route_warms_the_plots_while_its_rounds_run(tmp_path, a9a_small, monkeypatch):
    """The ServerApp's own-data route starts the plot warm-up (as the bundled route does) and joins
    it before its final write: run.png is written, and the thread has ended."""
    from flwr.app import Context, RecordDict

    import flower_vfl.apps.server as sa
    from _own_data_helpers import HANDLERS
    from flower_vfl.deploy.local_grid import LocalGrid

    started = []
    real = sa.warm_plots_thread

    def record(run_config):
        t = real(run_config)
        started.append(t)
        return t

    monkeypatch.setattr(sa, "warm_plots_thread", record)
    train, score = write_a9a_files(tmp_path, *a9a_small, fmt="csv")
    nodes = node_configs(train, score, "csv", tmp_path)
    rc = run_config(train, score, tmp_path, **{"max-rounds": 3, "out-dir": str(tmp_path / "out")})
    sa.main(LocalGrid(HANDLERS, nodes, rc), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                                    run_config=rc))
    assert len(started) == 1 and started[0] is not None and not started[0].is_alive()
    assert (tmp_path / "out" / "run.png").stat().st_size > 0
