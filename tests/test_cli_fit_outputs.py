"""Issue 22 items 4 and 7: what the in-process ``flower-vfl fit`` prints and writes."""

import warnings

import pytest

from flower_vfl.cli import main

WRECK = "the private parties made the model worse"


def test_fit_dp_says_a_wrecking_private_party_once_in_the_cli_words(capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # five noisy training releases of party 1 (its final model release alone no longer wrecks the model
        # since the party clips what it receives): the non-private party 0 alone scores better
        assert main(["fit", "--dataset", "breast_cancer", "--dp", "--dp-parties", "1", "--dp-seed", "5",
                     "--dp-train-rounds", "5", "--max-rounds", "20"]) == 0
    out, err = capsys.readouterr()
    text = out + err + "".join(str(w.message) for w in caught)
    assert text.count(WRECK) == 1
    line = next(x for x in err.splitlines() if WRECK in x)
    assert line.startswith("warning: the private parties made the model worse: test loss ")
    assert line.endswith("for the non-private parties alone. Their noise outweighs their columns at these "
                         "settings: raise --dp-lam, lower --dp-train-rounds or give them a larger --dp-epsilon")


def test_fit_on_own_files_saves_the_model_predict_reads(tmp_path, capsys):
    """Item 7: the in-process ``fit`` writes the files a Flower run saves (label-owner.npz,
    party-<m>.npz) beside its estimator model.npz; the predict job (its real handlers, in process)
    reads them and scores the new rows as the fitted estimator does."""
    import numpy as np
    from _own_data_helpers import _rows, node_configs, run_config, run_predict, write_a9a_files
    from flower_vfl import VerticalADMM
    from flower_vfl.io import read_party, source_from_config
    from flower_vfl.io.data import load_all

    X, y, Xt, _ = load_all("a9a")
    train, score = write_a9a_files(tmp_path, X[:800], y[:800], Xt[:200], "csv")
    out = tmp_path / "fit-out"
    assert main(["fit", "--labels", str(train[0]), "--party", str(train[1]), "--party", str(train[2]),
                 "--lam", "1e-3", "--max-rounds", "8", "--out-dir", str(out)]) == 0
    assert f"wrote {out}/label-owner.npz and party-0..2.npz (flower-vfl predict --model-dir {out})" in \
        capsys.readouterr().out
    nodes = node_configs(train, score, "csv", tmp_path, extra={m: {"model-dir": str(out)} for m in range(3)})
    res = run_predict(run_config(train, score, tmp_path, **{"model-dir": str(out)}), nodes)
    tabs = [read_party(source_from_config(nodes[100 + m], "score")) for m in range(3)]
    blocks = [t.X[_rows(t, res["ids"])] for t in tabs]
    expect = VerticalADMM.load(out / "model.npz").decision_function(blocks)
    assert len(res["ids"]) > 150 and np.max(np.abs(np.asarray(res["scores"]) - expect)) <= 1e-9
