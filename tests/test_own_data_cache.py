"""Own-data rounds on real SuperNodes (issue 22, item 6): every message is a fresh process, so a
party's aligned, preprocessed own-data block comes from its block cache on its own disk
(flower_vfl.io.party_cache.cached_own_block) and its scaling statistics from numpy, not from
scikit-learn (flower_vfl.io.preprocess).

Checked here: the numpy statistics equal scikit-learn's; a block served from the cache equals a
fresh parse (array_equal, dtypes, preprocessing, IDs); a file rewritten in place (same path, same
size, same time stamps) is read again; the cache folder stays bounded whatever orders the central
node sends. Everything through the real PSI handler (psi_order) with fresh Contexts."""

import os

import numpy as np
import pytest
import scipy.sparse as sp
from flwr.app import ConfigRecord, Context, Message, RecordDict

from flower_vfl.clients import psi_party
from flower_vfl.io import party_cache as pc
from flower_vfl.io import psi
from flower_vfl.io.bundled import write_table
from flower_vfl.io.preprocess import Preprocessor, maxabs_scale, standardize_stats


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch):
    """What a fresh flwr-clientapp process starts with: no in-memory copies, the cache on."""
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0
    monkeypatch.delenv("FLOWER_VFL_BLOCK_CACHE", raising=False)
    _forget()
    yield
    _forget()


def _forget():
    psi_party._TABLES.clear()
    pc._OWN_MEMO.clear()


# ------------------------------------------------------------------ numpy statistics = scikit-learn's
def _matrices(seed):
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(2, 200)), int(rng.integers(3, 10))
    X = rng.standard_normal((n, d)) * rng.choice([1e-9, 1.0, 1e6], d) + rng.choice([0.0, 5.0, 1e8], d)
    X[:, 0] = 3.3                                        # constant: scale 1
    X[:, 1] = 0.0                                        # all zero
    X[rng.random(n) < 0.7, 2] = 0.0                      # mostly zero
    X = X.round(int(rng.integers(0, 6)))
    S = sp.random(n, d, density=float(rng.uniform(0.05, 1.0)), random_state=seed, format="csr")
    S.data = np.round(S.data * 10 - 3, 2)
    if S.nnz:
        S.data[0] = 0.0                                  # an explicit zero
    full = sp.csr_matrix(np.full((n, d), 2.5) + np.arange(d))   # no implicit zeros
    return X, S, full


@pytest.mark.parametrize("seed", range(12))
def test_standardize_and_maxabs_equal_scikit_learn(seed):
    skp = pytest.importorskip("sklearn.preprocessing")
    X, S, full = _matrices(seed)
    sc = skp.StandardScaler().fit(X)
    mean, scale = standardize_stats(X)
    np.testing.assert_allclose(mean, sc.mean_, rtol=1e-12, atol=0)
    np.testing.assert_allclose(scale, sc.scale_, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(scale == 1.0, sc.scale_ == 1.0)        # the same near-constant columns
    np.testing.assert_array_equal(maxabs_scale(X), skp.MaxAbsScaler().fit(X).scale_)
    for M in (S, full):
        ss = skp.StandardScaler(with_mean=False).fit(M)
        mean, scale = standardize_stats(M)
        assert not np.any(mean)                                           # sparse: scaled, not centred
        np.testing.assert_allclose(scale, ss.scale_, rtol=1e-12, atol=0)
        np.testing.assert_array_equal(scale == 1.0, ss.scale_ == 1.0)
        np.testing.assert_array_equal(maxabs_scale(M), skp.MaxAbsScaler().fit(M).scale_)
    # the transformed rows, as the parties use them
    np.testing.assert_allclose(Preprocessor("standardize").fit_transform(X, list(range(X.shape[1]))),
                               skp.StandardScaler().fit_transform(X), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(Preprocessor("maxabs").fit_transform(S, list(range(S.shape[1]))).toarray(),
                               skp.MaxAbsScaler().fit_transform(S).toarray(), rtol=1e-12, atol=0)


def test_preprocessing_imports_no_scikit_learn():
    import subprocess
    import sys
    code = ("import sys, numpy as np; from flower_vfl.io.preprocess import Preprocessor; "
            "Preprocessor('standardize').fit(np.arange(6.).reshape(3, 2), ['a', 'b']); "
            "Preprocessor('maxabs').fit(np.arange(6.).reshape(3, 2), ['a', 'b']); "
            "print(any(m == 'sklearn' or m.startswith('sklearn.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ the party's block cache
def _ctx(nc, run_id=1):
    return Context(run_id=run_id, node_id=7, node_config=dict(nc), state=RecordDict(), run_config={})


def _order(context, ids, split="train"):
    msg = Message(RecordDict({"psi": ConfigRecord({"split": split, "order": psi.encode_ids(ids),
                                                   "digest": psi.ids_digest(ids)})}), dst_node_id=7,
                  message_type="query.psi_order")
    return psi_party.psi_order(msg, context).content["psi"]


def _write(path, ids, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    X = np.round(rng.standard_normal((len(ids), 3)) * scale, 3)
    import pyarrow as pa
    from pyarrow import csv
    cols = {"id": pa.array(list(ids)), "f1": pa.array(X[:, 0]), "f2": pa.array(X[:, 1]),
            "f3": pa.array(np.where(X[:, 2] > 0, X[:, 2], 0.0)),
            "region": pa.array([("north", "south", "east")[i % 3] for i in range(len(ids))])}
    csv.write_csv(pa.table(cols), str(path))
    return path


@pytest.fixture
def party(tmp_path):
    """A party with training and held-out files (a categorical column, standardized)."""
    ids = [f"c{i:04d}" for i in range(120)]
    tids = [f"t{i:04d}" for i in range(40)]
    nc = {"partition-id": 1, "data-path": str(_write(tmp_path / "bank.csv", ids, 0)),
          "test-path": str(_write(tmp_path / "bank-test.csv", tids, 1)), "categorical": "region",
          "preprocess": "standardize", "state-dir": str(tmp_path / "state")}
    return nc, ids, tids


def _aligned(nc, ids, tids, run_id=1):
    context = _ctx(nc, run_id)
    order = list(reversed(ids))[:100]                  # the label owner's order: a subset, its own order
    _order(context, order)
    _order(context, tids[5:], split="test")
    return context


def _fresh(context, monkeypatch):
    """own_blocks with the cache off: a fresh parse, alignment and preprocessing."""
    _forget()
    monkeypatch.setenv("FLOWER_VFL_BLOCK_CACHE", "0")
    try:
        return psi_party.own_blocks(context)
    finally:
        monkeypatch.delenv("FLOWER_VFL_BLOCK_CACHE")
        _forget()


def _same(a, b):
    D, T, pre, ids = a
    D2, T2, pre2, ids2 = b
    for M, M2 in ((D, D2), (T, T2)):
        assert type(M) is type(M2)
        if sp.issparse(M):
            for attr in ("data", "indices", "indptr"):
                x, y = getattr(M, attr), getattr(M2, attr)
                assert x.dtype == y.dtype and np.array_equal(x, y)
            assert M.shape == M2.shape
        else:
            assert M.dtype == M2.dtype and M.shape == M2.shape and np.array_equal(M, M2)
    assert pre.to_dict() == pre2.to_dict()
    assert ids.dtype == ids2.dtype and np.array_equal(ids, ids2)


def _cache_files(nc):
    return sorted((pc.block_cache_dir(nc["state-dir"])).glob("*.npz"))


@pytest.mark.parametrize("extra", [{}, {"sparse": "true", "preprocess": "maxabs"}])
def test_cached_block_equals_a_fresh_parse(party, monkeypatch, extra):
    nc, ids, tids = party
    nc = dict(nc, **extra)
    context = _aligned(nc, ids, tids)
    fresh = _fresh(context, monkeypatch)
    assert not _cache_files(nc)                         # the cache off writes nothing
    first = psi_party.own_blocks(context)               # parses and writes the cache
    assert len(_cache_files(nc)) == 1
    _same(first, fresh)
    _forget()                                           # the next message: a fresh process

    def no_parse(*a, **k):
        raise AssertionError("served from the cache: the party's file is not parsed again")
    monkeypatch.setattr(psi_party, "read_party", no_parse)
    again = psi_party.own_blocks(context)
    _same(again, fresh)
    assert fresh[0].shape == (100, 3 + 3) and fresh[1].shape == (35, 3 + 3)
    assert list(fresh[3]) == list(reversed(ids))[:100]


@pytest.mark.parametrize("settled", [False, True])
def test_a_file_rewritten_in_place_is_read_again(party, monkeypatch, settled):
    """``settled``: the file is older than the racy window when hashed, so its digest is kept by
    stat (verified.json); the rewrite moves its change time, which utime cannot set back."""
    nc, ids, tids = party
    context = _aligned(nc, ids, tids)
    if settled:
        import time
        monkeypatch.setattr(pc, "RACY_S", 0.05)
        time.sleep(0.1)
    before = psi_party.own_blocks(context)
    path = nc["data-path"]
    assert (str(path) in pc._Verified(pc.block_cache_dir(nc["state-dir"])).files) == settled
    st = os.stat(path)
    old = open(path, "rb").read()
    # other values, the same IDs and rows, the same size and time stamps (digits swapped)
    new = old.replace(b"1", b"#").replace(b"2", b"1").replace(b"#", b"2")
    assert new != old and len(new) == len(old)
    with open(path, "wb") as fh:
        fh.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    after = psi_party.own_blocks(context)               # same process: the memo must not serve it either
    assert not np.array_equal(after[0], before[0])
    _same(after, _fresh(context, monkeypatch))
    assert len(_cache_files(nc)) == 1                   # the old file's block was replaced
    _forget()
    _same(psi_party.own_blocks(context), _fresh(context, monkeypatch))   # and from disk


def test_a_second_message_hashes_no_unchanged_file(party, monkeypatch):
    """Once the party's files are older than the racy window, the next message (a fresh process)
    takes their digests from verified.json and maps the verified block: nothing is hashed, and
    the block equals a fresh parse."""
    import time
    nc, ids, tids = party
    context = _aligned(nc, ids, tids)
    monkeypatch.setattr(pc, "RACY_S", 0.05)
    time.sleep(0.1)
    psi_party.own_blocks(context)
    fresh = _fresh(context, monkeypatch)
    _forget()
    monkeypatch.setattr(pc, "_content_digest", lambda p: (_ for _ in ()).throw(AssertionError(f"hashed {p}")))
    monkeypatch.setattr(pc, "_digest", lambda a: (_ for _ in ()).throw(AssertionError("block checksum computed")))
    _same(psi_party.own_blocks(context), fresh)


def _count_verified_reads(monkeypatch) -> list:
    """Every opening of a block cache's verified.json for reading (pathlib or open()), as paths."""
    import builtins
    import pathlib
    seen = []
    real_path_open, real_open = pathlib.Path.open, builtins.open

    def note(file, mode):
        if os.path.basename(os.fspath(file)) == pc.VERIFIED and not any(c in str(mode) for c in "wax+"):
            seen.append(os.fspath(file))

    def path_open(self, mode="r", *a, **k):
        note(self, mode)
        return real_path_open(self, mode, *a, **k)

    def plain_open(file, mode="r", *a, **k):
        if isinstance(file, (str, bytes, os.PathLike)):
            note(file, mode)
        return real_open(file, mode, *a, **k)
    monkeypatch.setattr(pathlib.Path, "open", path_open)
    monkeypatch.setattr(builtins, "open", plain_open)
    return seen


@pytest.mark.parametrize("settled", [False, True])
def test_one_message_reads_verified_json_once(party, monkeypatch, settled):
    """own_blocks (one own-data message: the key over the files' digests, then the block) reads
    the block cache's verified.json once, when it writes the block and when it maps it; what it
    serves and what it hashes are unchanged (test_a_second_message_hashes_no_unchanged_file)."""
    nc, ids, tids = party
    context = _aligned(nc, ids, tids)
    if settled:
        import time
        monkeypatch.setattr(pc, "RACY_S", 0.05)
        time.sleep(0.1)
    fresh = _fresh(context, monkeypatch)
    verified = str(pc.block_cache_dir(nc["state-dir"]) / pc.VERIFIED)
    for message in range(3):                            # writes the block, then maps it (fresh processes)
        with pytest.MonkeyPatch.context() as mp:
            seen = _count_verified_reads(mp)
            got = psi_party.own_blocks(context)
        assert seen == [verified], (message, seen)
        _same(got, fresh)
        assert os.path.isfile(verified)
        _forget()


def test_a_damaged_cache_file_is_not_served(party, monkeypatch):
    nc, ids, tids = party
    context = _aligned(nc, ids, tids)
    psi_party.own_blocks(context)
    (f,) = _cache_files(nc)
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))
    _forget()
    _same(psi_party.own_blocks(context), _fresh(context, monkeypatch))


def test_the_cache_stays_bounded(party, tmp_path):
    """A central node sending a new order every run (or a party with many files) never grows the
    party's cache past MAX_FILES files, and one source keeps one file."""
    nc, ids, tids = party
    rng = np.random.default_rng(5)
    for run in range(8):                                # 8 runs, 8 different agreed orders
        context = _ctx(nc, run_id=100 + run)
        _order(context, list(rng.permutation(ids)[: 60 + run]))
        D = psi_party.own_blocks(context)[0]
        assert D.shape[0] == 60 + run
        assert len(_cache_files(nc)) == 1
    for k in range(2 * pc.MAX_FILES):                   # many files declared by this node over time
        other = dict(nc, **{"data-path": str(_write(tmp_path / f"f{k}.csv", ids, 10 + k))})
        other.pop("test-path")
        context = _ctx(other, run_id=200 + k)
        _order(context, ids[:50])
        psi_party.own_blocks(context)
        assert len(_cache_files(nc)) <= pc.MAX_FILES


def test_the_key_follows_what_the_node_config_declares(party):
    """Another ID column, column list or preprocessing, another file content, another agreed
    order: another key; the same declaration, content and order: the same key."""
    from flower_vfl.io import source_from_config
    nc, ids, tids = party
    idx = np.arange(10)

    def key(cfg, idx=idx, digest="d"):
        return pc.own_block_key([("train", source_from_config(cfg, "train"), idx, digest)])
    base = key(nc)
    assert base == key(dict(nc))
    for changed in ({"preprocess": "maxabs"}, {"columns": "f1,f2"}, {"categorical": ""}, {"sparse": "true"}):
        assert key(dict(nc, **changed)) != base
    assert key(nc, idx=idx[::-1]) != base and key(nc, digest="e") != base
    gone = dict(nc, **{"data-path": str(nc["data-path"]) + ".missing.csv"})
    assert pc.own_block_key([("train", source_from_config(gone, "train"), idx, "d")]) is None   # no file: no cache
