"""Party data sources: formats, column selection, preprocessing, and the bad-data suite."""

import numpy as np
import pytest
import scipy.sparse as sp

from flower_vfl.io import DataError, Preprocessor, align_rows, read_party, source_from_config
from flower_vfl.io.bundled import write_table


def _csv(path, text):
    path.write_text(text)
    return str(path)


def test_csv_parquet_libsvm_read_the_same_rows(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4)).round(6)
    X[X < -0.5] = 0.0
    ids = [f"id{i}" for i in range(30)]
    y = rng.integers(0, 2, 30)
    tabs = {}
    for fmt, ext in (("csv", ".csv"), ("parquet", ".parquet"), ("libsvm", ".svm")):
        p = write_table(tmp_path / f"a{ext}", ids, X, ["a", "b", "c", "d"], fmt, y=y)
        cfg = {"data-path": str(p), "label-column": "label", "n-features": 4}
        tabs[fmt] = read_party(source_from_config(cfg))
    for fmt, t in tabs.items():
        D = t.X.toarray() if sp.issparse(t.X) else t.X
        np.testing.assert_array_equal(D, X, err_msg=fmt)
        assert list(t.ids) == ids and np.array_equal(t.y, y), fmt
    assert sp.issparse(tabs["libsvm"].X) and not sp.issparse(tabs["csv"].X)
    assert tabs["csv"].columns == ["a", "b", "c", "d"] and tabs["libsvm"].columns == ["f1", "f2", "f3", "f4"]


def test_column_selection_by_name_and_libsvm_sidecar(tmp_path):
    p = _csv(tmp_path / "p.csv", "id,x,y,z\n7,1,2,3\n8,4,5,6\n")
    t = read_party(source_from_config({"data-path": p, "columns": "z, x"}))
    np.testing.assert_array_equal(t.X, [[3, 1], [6, 4]])
    assert t.columns == ["z", "x"] and list(t.ids) == ["7", "8"]
    s = tmp_path / "s.svm"
    s.write_text("1 1:0.5 3:2\n-1 2:1\n")
    (tmp_path / "ids.txt").write_text("a\nb\n")
    t = read_party(source_from_config({"data-path": str(s), "id-path": str(tmp_path / "ids.txt"),
                                       "columns": "f3,f1", "sparse": "false"}))
    np.testing.assert_array_equal(t.X, [[2, 0.5], [0, 0]])


def test_preprocessing_fitted_on_training_rows_matches_sklearn(tmp_path):
    from sklearn.preprocessing import MaxAbsScaler, OneHotEncoder, StandardScaler
    rng = np.random.default_rng(1)
    X = rng.standard_normal((50, 3)) * [1, 10, 100] + [0, 5, -3]
    cats = {"c": rng.choice(["red", "green", "blue"], 50)}
    Xs, cs = rng.standard_normal((7, 3)), {"c": np.array(["red", "violet", "blue", "green", "red", "red", "x"])}
    for kind, ref in (("standardize", StandardScaler()), ("maxabs", MaxAbsScaler())):
        pre = Preprocessor(kind).fit(X, ["a", "b", "c0"], cats)
        ohe = OneHotEncoder(handle_unknown="ignore", sparse_output=False).fit(cats["c"].reshape(-1, 1))
        want = np.hstack([ref.fit(X).transform(Xs), ohe.transform(cs["c"].reshape(-1, 1))])
        np.testing.assert_allclose(pre.transform(Xs, cs), want, rtol=0, atol=1e-12)
        # kept as plain numbers: a saved model transforms scoring rows identically
        again = Preprocessor.from_dict(pre.to_dict())
        np.testing.assert_array_equal(again.transform(Xs, cs), pre.transform(Xs, cs))
    assert pre.feature_names_ == ["a", "b", "c0", "c=blue", "c=green", "c=red"]


def test_categorical_columns_from_a_csv(tmp_path):
    p = _csv(tmp_path / "p.csv", "id,age,city\n1,30,Oslo\n2,40,Rome\n3,50,Oslo\n")
    t = read_party(source_from_config({"data-path": p, "categorical": "city"}))
    D = Preprocessor("none").fit_transform(t.X, t.columns, t.categorical)
    np.testing.assert_array_equal(D, [[30, 1, 0], [40, 0, 1], [50, 1, 0]])


def test_align_rows_orders_by_the_agreed_ids():
    assert align_rows(np.array(["c", "a", "b"]), ["b", "c"]).tolist() == [2, 0]
    # the refusal reaches the requester: it says that some are missing, never how many (a count of
    # guessed IDs not held would be more than the one bit the PSI log counts)
    for order in (["a", "z"], ["a", "y", "z"]):
        with pytest.raises(DataError) as err:
            align_rows(np.array(["a"]), order, where="party 1")
        assert str(err.value) == ("party 1: some ID(s) of the agreed order are not in this party's file (the "
                                  "alignment is stale: run the PSI step again)")


# ------------------------------------------------------------------ the bad-data suite
def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"the data file .*nope.csv does not exist; fix the node-config key "
                                        r"data-path"):
        read_party(source_from_config({"data-path": str(tmp_path / "nope.csv")}))


def test_missing_id_column(tmp_path):
    p = _csv(tmp_path / "p.csv", "key,x\n1,2\n")
    with pytest.raises(DataError, match=r"p.csv has no ID column 'id' \(columns: \['key', 'x'\]\); set the "
                                        r"node-config key id-column"):
        read_party(source_from_config({"data-path": p}))


def test_duplicated_ids_with_count(tmp_path):
    p = _csv(tmp_path / "p.csv", "id,x\n1,2\n1,3\n2,4\n2,5\n2,6\n3,7\n")
    with pytest.raises(DataError, match=r"p.csv: 3 duplicated ID\(s\) in column 'id' \(2 distinct, e.g. '1', "
                                        r"'2'\); each sample must appear once"):
        read_party(source_from_config({"data-path": p}))


def test_empty_id(tmp_path):
    p = _csv(tmp_path / "p.csv", "id,x\n1,2\n,3\n")
    with pytest.raises(DataError, match=r"p.csv: 1 row\(s\) have no ID in column 'id'"):
        read_party(source_from_config({"data-path": p}))


def test_nan(tmp_path):
    p = _csv(tmp_path / "p.csv", "id,x,w\n1,2,1\n2,NaN,1\n3,,1\n")
    with pytest.raises(DataError, match=r"p.csv, column 'x': 2 missing/NaN/inf value\(s\); impute or drop"):
        read_party(source_from_config({"data-path": p}))


def test_string_in_numeric_column(tmp_path):
    p = _csv(tmp_path / "p.csv", "id,x\n1,2\n2,3.5\n3,abc\n")
    with pytest.raises(DataError, match=r"p.csv, column 'x': row 3 holds the non-numeric value 'abc'; fix the "
                                        r"value, drop the column .* or list it in categorical"):
        read_party(source_from_config({"data-path": p}))


def test_label_column_on_a_party(tmp_path):
    p = _csv(tmp_path / "p.csv", "id,x,label\n1,2,0\n")
    with pytest.raises(DataError, match=r"p.csv holds the label column 'label' but this node is not the label "
                                        r"owner; drop that column"):
        read_party(source_from_config({"data-path": p}, forbidden_label="label"))


def test_unknown_column_and_format(tmp_path):
    p = _csv(tmp_path / "p.csv", "id,x\n1,2\n")
    with pytest.raises(DataError, match=r"has no column\(s\) \['q'\]; fix the node-config key columns"):
        read_party(source_from_config({"data-path": p, "columns": "x,q"}))
    with pytest.raises(DataError, match=r"cannot tell the format of .*p.xlsx .* set the node-config key format"):
        (tmp_path / "p.xlsx").write_text("x")
        read_party(source_from_config({"data-path": str(tmp_path / "p.xlsx")}))


def test_libsvm_sidecar_missing_or_short(tmp_path):
    s = tmp_path / "s.svm"
    s.write_text("1 1:0.5\n-1 2:1\n")
    with pytest.raises(DataError, match=r"the sidecar ID file .*s.svm.ids of .*s.svm does not exist"):
        read_party(source_from_config({"data-path": str(s)}))
    (tmp_path / "s.svm.ids").write_text("a\n")
    with pytest.raises(DataError, match=r"s.svm.ids holds 1 IDs but .*s.svm has 2 rows"):
        read_party(source_from_config({"data-path": str(s)}))


def test_the_default_data_dir_is_beside_the_repository_from_any_working_folder(tmp_path, monkeypatch):
    """``../shared`` beside the repository (CI: a fresh clone with ../shared beside it) is found from
    any working folder, not only from the repository's root."""
    from pathlib import Path

    from flower_vfl.io.data import default_data_dir
    import flower_vfl
    beside = Path(flower_vfl.__file__).resolve().parents[2] / "shared" / "data" / "a9a"   # <repo>/../shared
    monkeypatch.chdir(tmp_path)
    if beside.exists():
        assert default_data_dir("a9a") == beside
    else:                                   # an installed package: the working folder's ../shared
        assert default_data_dir("a9a") == tmp_path.parent / "shared" / "data" / "a9a"
