"""The party's on-disk block cache (flower_vfl.io.party_cache): a message served from the cache
gets bitwise the reply of a fresh parse, the privacy ledger's data fingerprint is unchanged, and
a changed data file (or a damaged cache file) is never served."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.io import data as data_mod
from flower_vfl.io import party_cache as pc
from flower_vfl.io.model_files import data_fingerprint

RC = {"dataset": "a9a", "num-parties": 2, "lam": 1e-2}
_PARTY_BLOCK = data_mod.party_block          # the real one (a test replaces it with _no_parse)


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0


def _write_libsvm(path, n, seed):
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        cols = np.sort(rng.choice(np.arange(1, 124), size=rng.integers(3, 15), replace=False))
        label = "+1" if rng.random() < 0.4 else "-1"
        lines.append(label + " " + " ".join(f"{c}:1" for c in cols))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def a9a_dir(tmp_path, monkeypatch):
    """A small stand-in for a9a (same format, 123 features), and no memo from earlier tests."""
    monkeypatch.setenv("FLOWER_VFL_CACHE", str(tmp_path / "bundled"))
    monkeypatch.delenv("FLOWER_VFL_BLOCK_CACHE", raising=False)
    d = tmp_path / "a9a"
    d.mkdir()
    _write_libsvm(d / "a9a", 60, 0)
    _write_libsvm(d / "a9a.t", 25, 1)
    _forget()
    yield d
    _forget()


def _forget():
    """What a fresh flwr-clientapp process starts with: no in-memory copies."""
    _PARTY_BLOCK.cache_clear()
    data_mod.load_all.cache_clear()
    pc._MEMO.clear()


def _node(tmp_path, d):
    return {"partition-id": 1, "state-dir": str(tmp_path / "party1"), "data-dir": str(d)}


def _train(nc, n, seed=0):
    rng = np.random.default_rng(seed)
    rd = RecordDict({"config": ConfigRecord({"round": 1, "rho": 1e-1, "alpha": 1.0, "theta": 0.5}),
                     "vectors": ArrayRecord({"q": Array(rng.normal(size=n)), "y": Array(rng.normal(size=n) * 1e-2)})})
    context = Context(run_id=1, node_id=7, node_config=dict(nc), state=RecordDict(), run_config=dict(RC))
    reply = ca.train(Message(rd, dst_node_id=7, message_type="train"), context)
    assert "release" in reply.content, dict(reply.content.get("refusal", {}))
    return reply.content["release"]["s"].numpy()


def _no_parse(*a, **k):
    raise AssertionError("the data file was parsed although a valid cache file exists")


def test_cached_block_gives_bitwise_the_fresh_reply_and_ledger_fingerprint(tmp_path, a9a_dir, monkeypatch):
    nc = _node(tmp_path, a9a_dir)
    D, D_test = data_mod.party_block("a9a", 1, 2, str(a9a_dir))
    monkeypatch.setenv("FLOWER_VFL_BLOCK_CACHE", "0")
    s_fresh = _train(nc, D.shape[0])
    assert not (tmp_path / "party1" / "block-cache").exists()      # off: nothing written

    monkeypatch.delenv("FLOWER_VFL_BLOCK_CACHE")
    _forget()
    _train(nc, D.shape[0])                                         # parses and writes the cache
    files = list((tmp_path / "party1" / "block-cache").glob("*.npz"))
    assert len(files) == 1

    _forget()
    monkeypatch.setattr(data_mod, "party_block", _no_parse)        # a new process: disk only
    C, C_test = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), nc["state-dir"])
    assert type(C) is type(D) and C.indices.dtype == D.indices.dtype and C.indptr.dtype == D.indptr.dtype
    assert data_fingerprint(C) == data_fingerprint(D) and data_fingerprint(C_test) == data_fingerprint(D_test)
    s_cached = _train(nc, D.shape[0])
    assert s_cached.dtype == s_fresh.dtype and s_cached.tobytes() == s_fresh.tobytes()


def test_a_changed_data_file_is_parsed_again_and_replaces_the_cached_block(tmp_path, a9a_dir):
    state = str(tmp_path / "party0")
    old, _ = pc.cached_party_block("a9a", 0, 2, str(a9a_dir), state)
    lines = (a9a_dir / "a9a").read_text().splitlines()
    lines[3] = "+1 1:1 2:1 3:1"                                    # one row changes in party 0's columns
    (a9a_dir / "a9a").write_text("\n".join(lines) + "\n")
    _forget()
    new, _ = pc.cached_party_block("a9a", 0, 2, str(a9a_dir), state)
    _forget()
    ref, _ = data_mod.party_block("a9a", 0, 2, str(a9a_dir))
    assert data_fingerprint(new) == data_fingerprint(ref) != data_fingerprint(old)
    assert len(list((tmp_path / "party0" / "block-cache").glob("*.npz"))) == 1   # the stale one is gone


def test_a_damaged_cache_file_is_ignored_and_rewritten(tmp_path, a9a_dir, monkeypatch):
    state = str(tmp_path / "party1")
    D, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    (f,) = (tmp_path / "party1" / "block-cache").glob("*.npz")
    f.write_bytes(f.read_bytes()[:-40])                            # torn write
    _forget()
    again, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    assert data_fingerprint(again) == data_fingerprint(D)
    _forget()
    monkeypatch.setattr(data_mod, "party_block", _no_parse)
    assert data_fingerprint(pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)[0]) == data_fingerprint(D)


def _train_with_num_parties(nc, k):
    """A fresh process answering a train message of a run whose (server-written) config says
    num-parties = k."""
    RC["num-parties"] = k
    try:
        _forget()
        _train(nc, 60)
    finally:
        RC["num-parties"] = 2


def test_a_server_varying_num_parties_cannot_fill_the_party_disk(tmp_path, a9a_dir):
    """The run config (the server's) names num-parties; each value is a different block. A server
    cycling through 2..12 leaves at most MAX_FILES blocks on the party's disk, the newest ones,
    and the block in use is always among them."""
    nc = _node(tmp_path, a9a_dir)
    folder = pc.block_cache_dir(nc["state-dir"])
    for k in range(2, 13):
        _train_with_num_parties(nc, k)
        files = sorted(folder.glob("*.npz"))
        assert len(files) == min(k - 1, pc.MAX_FILES)
        assert any(f.name.startswith(f"a9a-p1of{k}-") for f in files)
    kept = {f.name.split("-")[1] for f in folder.glob("*.npz")}
    assert kept == {"p1of9", "p1of10", "p1of11", "p1of12"}


def test_a_block_in_use_survives_eviction(tmp_path, a9a_dir, monkeypatch):
    """Least recently *used*, not written: re-reading the 2-party block keeps it while others come."""
    nc = _node(tmp_path, a9a_dir)
    folder = pc.block_cache_dir(nc["state-dir"])
    ref = _train(nc, 60)
    for k in range(3, 3 + pc.MAX_FILES + 2):
        _train_with_num_parties(nc, k)
        _forget()
        monkeypatch.setattr(data_mod, "party_block", _no_parse)     # 2 parties must come from disk
        assert np.array_equal(_train(nc, 60), ref)
        monkeypatch.setattr(data_mod, "party_block", _PARTY_BLOCK)
    assert len(list(folder.glob("*.npz"))) == pc.MAX_FILES
    assert any(f.name.startswith("a9a-p1of2-") for f in folder.glob("*.npz"))
