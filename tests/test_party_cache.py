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
    pc._SERVED.clear()


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


# ------------------------------------------------------------------ what a message re-checks
def _settled(monkeypatch, *paths):
    """Files older than the racy window (made short here): their digests may be kept by stat."""
    import time
    monkeypatch.setattr(pc, "RACY_S", 0.05)
    time.sleep(0.1)


def test_a_second_message_maps_the_verified_block_without_hashing_anything(tmp_path, a9a_dir, monkeypatch):
    """Once a block's checksum held and the source files' digests are kept (verified.json), a new
    process neither hashes a source file nor the block: it maps the npz (read-only views, bitwise
    the fresh parse's arrays, same classes and dtypes)."""
    state = str(tmp_path / "party1")
    _settled(monkeypatch)
    D, D_test = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)      # parses, writes, keeps digests
    _forget()
    monkeypatch.setattr(data_mod, "party_block", _no_parse)
    monkeypatch.setattr(pc, "_content_digest", lambda p: (_ for _ in ()).throw(AssertionError(f"hashed {p}")))
    monkeypatch.setattr(pc, "_digest", lambda a: (_ for _ in ()).throw(AssertionError("block checksum computed")))
    for _ in range(2):
        _forget()
        C, C_test = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
        for got, ref in ((C, D), (C_test, D_test)):
            assert type(got) is type(ref) and got.shape == ref.shape and got.has_sorted_indices == ref.has_sorted_indices
            for a in ("data", "indices", "indptr"):
                x, y = getattr(got, a), getattr(ref, a)
                assert x.dtype == y.dtype and x.tobytes() == y.tobytes() and not x.flags.writeable


def test_later_messages_write_nothing_in_the_cache_folder(tmp_path, a9a_dir, monkeypatch):
    """A block that is already the folder's most recently used is not touched again: no message
    after the first writes anything there (a touch moved the block's change time, and every
    message wrote verified.json again); a block used after another one is touched (the test
    above: it survives eviction)."""
    import os
    state = str(tmp_path / "party1")
    _settled(monkeypatch)
    pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    folder = pc.block_cache_dir(state)

    def stats():
        return {f: (st.st_size, st.st_mtime_ns, st.st_ctime_ns) for f in os.listdir(folder)
                for st in [os.stat(folder / f)]}
    before = stats()
    assert sorted(f.rsplit("-", 1)[0] for f in before) == ["a9a-p1of2", "verified.json"]
    monkeypatch.setattr(pc, "atomic_write", lambda *a, **k: (_ for _ in ()).throw(AssertionError("wrote")))
    monkeypatch.setattr(os, "utime", lambda *a, **k: (_ for _ in ()).throw(AssertionError("touched")))
    for _ in range(2):
        _forget()
        pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    assert stats() == before


def test_a_source_file_rewritten_in_place_with_its_size_and_mtime_is_parsed_again(tmp_path, a9a_dir, monkeypatch):
    """The kept digest is keyed by the change time too, which a write moves and utime cannot set
    back: same size, same inode, modification time restored -> hashed and parsed again."""
    import os
    state = str(tmp_path / "party0")
    _settled(monkeypatch)
    old, _ = pc.cached_party_block("a9a", 0, 2, str(a9a_dir), state)
    f = a9a_dir / "a9a"
    kept = pc._Verified(pc.block_cache_dir(state)).files
    assert str(f) in kept                                            # its digest was kept
    st = f.stat()
    text = f.read_text()
    lines = text.splitlines()
    i = next(k for k, l in enumerate(lines) if " 1:1" not in l and " 2:1" not in l and l.split()[1] != "3:1")
    first = lines[i].split()[1]                                      # a column of party 0 (1..61) -> another
    assert int(first.split(":")[0]) <= 61
    lines[i] = lines[i].replace(" " + first, " 1:1", 1) if len(first) == 3 else lines[i].replace(" " + first, " 10:1", 1)
    new_text = "\n".join(lines) + "\n"
    assert len(new_text) == len(text) and new_text != text
    with open(f, "r+") as fh:                                        # in place: same inode
        fh.write(new_text)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_ino == st.st_ino and f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    _forget()
    new, _ = pc.cached_party_block("a9a", 0, 2, str(a9a_dir), state)
    _forget()
    ref, _ = data_mod.party_block("a9a", 0, 2, str(a9a_dir))
    assert data_fingerprint(new) == data_fingerprint(ref) != data_fingerprint(old)


def test_a_racy_file_is_hashed_again(tmp_path, a9a_dir, monkeypatch):
    """A file changed less than RACY_S before it was hashed may still change within the same time
    stamp: its digest is not kept (the next message hashes it again)."""
    state = str(tmp_path / "party1")
    monkeypatch.setattr(pc, "RACY_S", 3600.0)
    pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    kept = pc._Verified(pc.block_cache_dir(state)).files
    assert str(a9a_dir / "a9a") not in kept and str(a9a_dir / "a9a.t") not in kept
    assert sum(v[-1][0] == "ok" for v in kept.values() if isinstance(v[-1], list)) == 1   # the block it wrote is


def test_a_block_changed_in_place_with_its_mtime_kept_is_checked_and_rewritten(tmp_path, a9a_dir, monkeypatch):
    """A verified block altered in place (same size and modification time: only its change time
    moves) is checksummed again, fails, and is parsed and rewritten."""
    import os
    state = str(tmp_path / "party1")
    _settled(monkeypatch)
    D, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    (f,) = pc.block_cache_dir(state).glob("*.npz")
    st = f.stat()
    import zipfile
    with zipfile.ZipFile(f) as zf:
        info = zf.getinfo("train.data.npy")
    raw = bytearray(f.read_bytes())
    raw[info.header_offset + info.compress_size] ^= 0x40             # a byte of D's values (a valid npz still)
    with zipfile.ZipFile(__import__("io").BytesIO(bytes(raw))) as zf:
        assert zf.testzip() == "train.data.npy"                      # only zip's CRC and our checksum see it
    with open(f, "r+b") as fh:
        fh.write(raw)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    _forget()
    again, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    assert data_fingerprint(again) == data_fingerprint(D)
    _forget()
    monkeypatch.setattr(data_mod, "party_block", _no_parse)          # the rewritten file serves the next one
    assert data_fingerprint(pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)[0]) == data_fingerprint(D)


def _places(state):
    """The block file and the places verified.json records for it (with the stat key they are tied to)."""
    (f,) = pc.block_cache_dir(state).glob("*.npz")
    row = pc._Verified(pc.block_cache_dir(state)).files[str(f)]
    return f, row[:-1], (row[-1][1] if isinstance(row[-1], list) else None)


def test_a_verified_block_is_mapped_at_its_recorded_places_without_parsing_a_header(tmp_path, a9a_dir, monkeypatch):
    """The places of the block's arrays are recorded with the block's verified stat key when it is
    written; a later message maps them there without parsing the zip directory or a .npy header
    (and hashes nothing), bitwise the fresh parse's arrays."""
    import os
    state = str(tmp_path / "party1")
    _settled(monkeypatch)
    D, D_test = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    f, key, places = _places(state)
    st = os.stat(f)
    assert key == [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    assert sorted(places) == sorted(["checksum", *(f"{p}.{a}" for p in ("train", "test")
                                                   for a in ("kind", "shape", "data", "indices", "indptr", "sorted"))])
    monkeypatch.setattr(data_mod, "party_block", _no_parse)
    monkeypatch.setattr(pc, "_digest", lambda a: (_ for _ in ()).throw(AssertionError("block checksum computed")))
    monkeypatch.setattr(pc.zipfile, "ZipFile", lambda *a, **k: (_ for _ in ()).throw(AssertionError("zip parsed")))
    monkeypatch.setattr(pc, "read_npy_header", lambda *a, **k: (_ for _ in ()).throw(AssertionError("header parsed")))
    _forget()
    C, C_test = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    for got, ref in ((C, D), (C_test, D_test)):
        assert type(got) is type(ref) and got.shape == ref.shape and got.has_sorted_indices == ref.has_sorted_indices
        for a in ("data", "indices", "indptr"):
            x, y = getattr(got, a), getattr(ref, a)
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes() and not x.flags.writeable


def test_a_block_changed_in_place_after_its_places_were_recorded_is_checked_and_rewritten(tmp_path, a9a_dir,
                                                                                          monkeypatch):
    """The recorded places are tied to the block's stat key, change time included: a byte of D's
    values altered in place (same inode, size and modification time) is not mapped at them; the
    block is checksummed, fails, and is parsed and written again (its new places recorded)."""
    import os
    state = str(tmp_path / "party1")
    _settled(monkeypatch)
    D, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    f, key, places = _places(state)
    st = f.stat()
    raw = bytearray(f.read_bytes())
    raw[places["train.data"][0]] ^= 0x40                              # D's first value, at its recorded place
    with open(f, "r+b") as fh:
        fh.write(raw)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert [f.stat().st_ino, f.stat().st_size, f.stat().st_mtime_ns] == key[1:4] and f.stat().st_ctime_ns != key[4]
    digests = []
    real = pc._digest
    monkeypatch.setattr(pc, "_digest", lambda a: digests.append(1) or real(a))
    _forget()
    again, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    assert digests and data_fingerprint(again) == data_fingerprint(D)       # checked, failed, parsed again
    f2, key2, places2 = _places(state)
    assert places2 is not None and key2[4] != key[4]
    assert np.frombuffer(f2.read_bytes()[places2["train.data"][0]:][:8])[0] == D.data[0]


def test_a_block_file_replaced_after_its_stat_was_checked_is_not_mapped(tmp_path, a9a_dir, monkeypatch):
    """The mapped read checks the stat key on the file it opened: a file that is not the one whose
    key was verified (here: the key of another moment) is not mapped, at recorded places or not;
    recorded places that do not fit in the file are not used either (the block is checksummed)."""
    import json
    state = str(tmp_path / "party1")
    _settled(monkeypatch)
    D, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    f, key, places = _places(state)
    stale = key[:4] + [key[4] - 1]
    assert pc._mapped_npz(f, stale, places) is None and pc._mapped_npz(f, stale) is None
    assert pc._mapped_npz(f, key, places)[1] == places
    vj = pc.block_cache_dir(state) / pc.VERIFIED
    rows = json.loads(vj.read_text())
    rows[str(f)][-1][1]["train.data"][0] = key[2]                     # past the end of the file
    vj.write_text(json.dumps(rows))
    assert pc._mapped_npz(f, key, rows[str(f)][-1][1]) is None
    digests = []
    real = pc._digest
    monkeypatch.setattr(pc, "_digest", lambda a: digests.append(1) or real(a))
    _forget()
    again, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    assert digests and data_fingerprint(again) == data_fingerprint(D)


def _fresh_release(nc, n):
    """The party's release for _train's message with no block in memory and no cache file read."""
    _forget()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLOWER_VFL_BLOCK_CACHE", "0")
        got = _train(nc, n)
    _forget()
    return got


def _no_read(*a, **k):
    raise AssertionError("the cache file was read although the warm process mapped it")


def test_a_forked_child_reports_its_verified_block_and_the_warm_process_maps_it_for_the_next(tmp_path, a9a_dir,
                                                                                             monkeypatch):
    """Through the real train handler: a message's process reports the request its verified block
    served (warm_exec's report); the warm executor maps that block (nothing parsed, hashed or
    written there); the next message's process computes the same request from its own node config
    and gets the mapped block without reading the cache folder, bitwise the same release as a
    fresh parse's; $FLOWER_VFL_WARM_BLOCKS=0 turns the mapping off."""
    import json
    import os

    from flower_vfl.deploy import warm_exec
    nc = _node(tmp_path, a9a_dir)
    _settled(monkeypatch)
    n = data_mod.party_block("a9a", 1, 2, str(a9a_dir))[0].shape[0]
    ref = _fresh_release(nc, n)
    _train(nc, n)                                                     # writes the block and its checks
    _forget()
    pc._SERVED.clear()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:                                                      # a forked ClientApp of the executor
        code = 1
        try:
            report = warm_exec._report_bundle_modules({}, wfd)
            _train(nc, n)
            report()
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    os.waitpid(pid, 0)
    info = json.loads(os.read(rfd, 65536))
    os.close(rfd)
    assert info == {"blocks": [["a9a", 1, 2, str(a9a_dir), nc["state-dir"]]]}
    folder = pc.block_cache_dir(nc["state-dir"])
    before = {f: os.stat(folder / f).st_mtime_ns for f in os.listdir(folder)}
    monkeypatch.setattr(pc, "_digest", lambda a: (_ for _ in ()).throw(AssertionError("block checksum computed")))
    monkeypatch.setattr(pc, "_content_digest", lambda p: (_ for _ in ()).throw(AssertionError(f"hashed {p}")))
    monkeypatch.setattr(data_mod, "party_block", _no_parse)
    monkeypatch.setenv("FLOWER_VFL_WARM_BLOCKS", "0")
    warm_exec._fork_executor()._preload_blocks(info["blocks"])
    assert pc._MEMO == {}
    monkeypatch.delenv("FLOWER_VFL_WARM_BLOCKS")
    warm_exec._fork_executor()._preload_blocks(info["blocks"])
    assert len(pc._MEMO) == 1
    assert {f: os.stat(folder / f).st_mtime_ns for f in os.listdir(folder)} == before
    monkeypatch.setattr(pc, "_read", _no_read)
    monkeypatch.setattr(pc, "_Verified", _no_read)
    got = _train(nc, n)
    assert got.tobytes() == ref.tobytes()


def test_a_block_changed_after_the_warm_process_mapped_it_is_checked_again(tmp_path, a9a_dir, monkeypatch):
    """A mapped block is used only while its file keeps the stat key (change time included) its
    verified read had: one byte of D's values altered in place (same inode, size, modification
    time) after the warm process mapped it -> the message checksums the file, finds it wrong, and
    parses and writes the block again (bitwise the fresh release)."""
    import os
    nc = _node(tmp_path, a9a_dir)
    _settled(monkeypatch)
    n = data_mod.party_block("a9a", 1, 2, str(a9a_dir))[0].shape[0]
    ref = _fresh_release(nc, n)
    _train(nc, n)
    served = pc.served_blocks()
    _forget()
    assert pc.preload_blocks(served) == 1
    f, key, places = _places(nc["state-dir"])
    st = f.stat()
    raw = bytearray(f.read_bytes())
    raw[places["train.data"][0]] ^= 0x40
    with open(f, "r+b") as fh:
        fh.write(raw)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    digests, parses = [], []
    real_digest, real_parse = pc._digest, data_mod.party_block
    monkeypatch.setattr(pc, "_digest", lambda a: digests.append(1) or real_digest(a))
    monkeypatch.setattr(data_mod, "party_block", lambda *a: parses.append(a) or real_parse(*a))
    got = _train(nc, n)
    assert digests and parses and got.tobytes() == ref.tobytes()


def test_a_source_file_rewritten_after_the_warm_process_mapped_its_block_is_parsed_again(tmp_path, a9a_dir,
                                                                                          monkeypatch):
    """The mapped block serves only the source files' stat keys it was mapped for (change time
    included): a data file rewritten in place with its size and modification time kept is a
    new request, parsed again (the block of the new content)."""
    import os
    state = str(tmp_path / "party1")
    _settled(monkeypatch)
    old, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    served = pc.served_blocks()
    _forget()
    assert pc.preload_blocks(served) == 1
    f = a9a_dir / "a9a"
    st = f.stat()
    text = f.read_text()
    new_text = text.replace("+1", "-1", 1)                              # one label: same size
    assert len(new_text) == len(text) and new_text != text
    with open(f, "r+") as fh:
        fh.write(new_text)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    parses = []
    real_parse = data_mod.party_block
    monkeypatch.setattr(data_mod, "party_block", lambda *a: parses.append(a) or real_parse(*a))
    got, _ = pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    assert parses == [("a9a", 1, 2, str(a9a_dir))]
    monkeypatch.setattr(data_mod, "party_block", real_parse)
    _PARTY_BLOCK.cache_clear()
    data_mod.load_all.cache_clear()
    ref, _ = data_mod.party_block("a9a", 1, 2, str(a9a_dir))
    assert data_fingerprint(got) == data_fingerprint(ref)
    assert got is not old


def test_the_warm_process_maps_only_verified_blocks_and_well_formed_requests(tmp_path, a9a_dir, monkeypatch):
    """preload_blocks hashes, parses and writes nothing: a block whose check is not recorded for its
    current stat, a request for a block never written, or a malformed request map nothing."""
    import os
    state = str(tmp_path / "party1")
    _settled(monkeypatch)
    pc.cached_party_block("a9a", 1, 2, str(a9a_dir), state)
    (req,) = pc.served_blocks()
    _forget()
    folder = pc.block_cache_dir(state)
    monkeypatch.setattr(pc, "_digest", lambda a: (_ for _ in ()).throw(AssertionError("block checksum computed")))
    monkeypatch.setattr(data_mod, "party_block", _no_parse)
    monkeypatch.setattr(pc, "atomic_write", lambda *a, **k: (_ for _ in ()).throw(AssertionError("wrote")))
    bad = [[req[0], True, 2, req[3], req[4]], [req[0], 1, 2, 7, req[4]], req[:4], "a9a",
           [req[0], 1, 3, req[3], req[4]]]
    assert pc.preload_blocks(bad) == 0 and pc.preload_blocks("x") == 0
    v = pc._Verified(folder)
    (f,) = folder.glob("*.npz")
    v.forget(f)
    (folder / pc.VERIFIED).write_text(__import__("json").dumps(v.files))   # the block's check not recorded
    assert pc.preload_blocks([req]) == 0 and pc._MEMO == {}
    assert sorted(os.listdir(folder)) == sorted([f.name, pc.VERIFIED])
