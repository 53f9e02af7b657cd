"""Non-linear party block models on own data (PSI), saved and scoring new rows: the parties' model
files hold each block's kind and settings (never a row), and the predict job maps new rows the
same way, so its scores equal the in-process engine's decision on the same rows."""

from __future__ import annotations

import numpy as np
import pytest

from _own_data_helpers import _rows, node_configs, run_config, run_predict, run_train, write_a9a_files
from flower_vfl import VerticalADMM
from flower_vfl.io import model_files as model_io
from flower_vfl.io import read_party, source_from_config
from flower_vfl.io.data import load_all

RFF = {"party-model": "rff", "party-model-features": 32, "party-model-seed": 4}
MLP = {"party-model": "mlp", "party-model-width": 8, "party-model-seed": 2, "party-model-epochs": 1,
       "party-model-batch": 128}


@pytest.fixture(scope="module")
def a9a_small():
    X, y, Xt, _ = load_all("a9a")
    return X[:800], y[:800], Xt[:300]


def _aligned(nodes, split):
    tabs = [read_party(source_from_config(nodes[100 + m], split)) for m in range(3)]
    common = set(tabs[0].ids)
    for t in tabs[1:]:
        common &= set(t.ids)
    order = [i for i in tabs[0].ids if i in common]
    return tabs, order, [t.X[_rows(t, order)] for t in tabs]


@pytest.mark.parametrize("kinds", [("spline", RFF), ("linear", MLP)], ids=["spline+rff", "mlp"])
def test_own_data_with_block_models_saves_kinds_and_predicts_new_rows_as_the_engine(tmp_path, a9a_small, kinds):
    """a9a as three parties' files (PSI-aligned, rows shuffled, 5 % missing at party 1); parties 1 and 2
    pick their block models in their node configs. The predict job's scores on a9a.t rows (new rows,
    aligned by PSI) equal the engine's decision_function fitted on the aligned intersection with the same
    party_model, to 1e-9; each party's model file holds its kind and settings and no training row."""
    pm = ["linear", kinds[0] if isinstance(kinds[0], dict) else {"party-model": kinds[0]}, kinds[1]]
    train, score = write_a9a_files(tmp_path, *a9a_small, fmt="csv")
    nodes = node_configs(train, score, "csv", tmp_path, extra={1: pm[1], 2: pm[2]})
    rc = run_config(train, score, tmp_path, **{"acceleration": "none", "variant": "sharing-fixed", "max-rounds": 8})
    run_train(rc, nodes)
    tabs, order, blocks = _aligned(nodes, "train")
    y = tabs[0].y[_rows(tabs[0], order)]
    model = VerticalADMM(lam=rc["lam"], max_rounds=8, tol=0, acceleration="none", variant="sharing-fixed",
                         party_model=pm).fit(blocks, y)
    _, sorder, sblocks = _aligned(nodes, "score")
    res = run_predict(rc, nodes)
    assert res["ids"] == [str(i) for i in sorder]
    np.testing.assert_allclose(res["scores"], model.decision_function(sblocks), rtol=0, atol=1e-9)
    for m in (1, 2):
        saved = model_io.load_model(tmp_path / f"models-party{m}" / f"party-{m}.npz")
        meta = saved["meta"]
        want = pm[m] if pm[m]["party-model"] != "linear" else None
        if want is None:
            assert "block" not in meta
            continue
        assert meta["block"]["kind"] == want["party-model"]
        assert {k: meta["block"]["settings"][k] for k in want if k != "party-model"} == \
            {k: v for k, v in want.items() if k != "party-model"}
        assert meta["block"]["d_in"] == blocks[m].shape[1]
        # no training row: the file holds x (the block's parameters) and the meta record only
        assert sorted(k for k in saved if k != "meta") == ["x"]
        np.testing.assert_array_equal(saved["x"], np.ravel(model.coef_[m]))


def test_own_data_refuses_a_map_fitted_on_rows_by_name(tmp_path, a9a_small):
    """Nystroem on own data: refused at identify, by name (its saved model would hold rows)."""
    from flwr.app import Array, ArrayRecord, Context, RecordDict
    import flower_vfl.clients.psi_party as pp
    from flower_vfl.apps.client import make_client
    from flower_vfl.config.schema import ConfigError
    train, score = write_a9a_files(tmp_path, *a9a_small, fmt="csv")
    nodes = node_configs(train, score, "csv", tmp_path, extra={1: {"party-model": "nystroem"}})
    rc = run_config(train, score, tmp_path)
    ctx = Context(run_id=1, node_id=101, node_config=nodes[101], state=RecordDict(), run_config=rc)
    # the party's rows as the PSI step would have aligned them (the first 10)
    ctx.state[pp.STATE_ALIGN + "train"] = ArrayRecord({"idx": Array(np.arange(10, dtype=np.int64))})
    with pytest.raises(ConfigError) as e:
        make_client(ctx)
    assert str(e.value) == ("party 1: party-model='nystroem' is refused on own data: its map is fitted on the "
                            "party's rows, and the saved model the predict job scores from would hold them; use a "
                            "data-independent kind ('rff', 'spline', 'bins', 'mlp') or 'linear'")


def test_private_rff_party_on_own_data_saves_x_tilde_on_mapped_columns_and_predicts_new_rows(tmp_path, a9a_small):
    """Party 2 private (ε = 1, noise from OS entropy) with an rff block on its own files: its model file
    holds the released x̃ on its mapped columns, with the block's kind and settings; the predict job maps
    the new rows by the rebuilt map and scores them as the saved blocks do (to 1e-9)."""
    from _own_data_helpers import RANGES, reference
    from flower_vfl.core.blocks import block_from_meta
    from flower_vfl.core.scoring import party_scores
    from flower_vfl.io.bundled import write_party_files
    X, y, Xt = a9a_small
    yt = load_all("a9a")[3][:Xt.shape[0]]
    train, score = write_a9a_files(tmp_path, X, y, Xt, "csv")
    test = write_party_files(Xt, yt, [f"t{i:06d}" for i in range(Xt.shape[0])], RANGES, tmp_path, "csv",
                             seed=5, prefix="test")
    extra = {m: {"test-path": str(test[m])} for m in range(3)}
    extra[2].update({"dp": True, "dp-epsilon": 1.0, "dp-lam": 3e-3, "state-dir": str(tmp_path / "p2"), **RFF})
    nodes = node_configs(train, score, "csv", tmp_path, extra=extra)
    rc = run_config(train, score, tmp_path, **{"labels-test-path": str(test[0])})
    st, _ = run_train(rc, nodes)
    assert [e["kind"] for e in st.privacy_[2]["ledger"]["entries"]] == ["eval"]
    _, _, sorder, _ = reference(nodes, rc)
    models = [model_io.load_model(tmp_path / f"models-party{m}" / f"party-{m}.npz") for m in range(3)]
    meta = models[2]["meta"]
    assert meta["private"] and meta["x_kind"] == "released x_tilde" and meta["block"]["kind"] == "rff"
    rff = block_from_meta(meta["block"])
    assert models[2]["x"].shape == (RANGES[2][1] - RANGES[2][0] + RFF["party-model-features"],)
    owner = model_io.load_model(tmp_path / "owner" / "label-owner.npz")
    _, _, blocks = _aligned(nodes, "score")
    blocks[2] = rff.features(blocks[2])
    f = float(np.ravel(owner["intercept"])[0]) + sum(
        party_scores(blocks[m], models[m]["x"], private=bool(models[m]["meta"]["private"])) for m in range(3))
    res = run_predict(rc, nodes)
    assert res["ids"] == [str(i) for i in sorder]
    assert np.max(np.abs(res["scores"] - f)) <= 1e-9
