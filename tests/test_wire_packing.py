"""A small message's arrays packed into its config record (flower_vfl.io.wire): fewer Flower
objects per message, the same bytes, nothing else changed.

- pack / unpack are exact inverses (float64, float32, uint64, (N, K)) and cut Flower's object
  count of a round's request from 7 to 2 and of a reply from 5 to 3 (Flower's own object tree);
  above PACK_MAX_BYTES nothing is packed;
- a party (the real ClientApp handlers, a fresh Context per run) tells identify which message
  types it reads packed; its reply to a packed request is packed and decodes bitwise to its reply
  to the same request unpacked, with the same context.state after it;
- what does not decode is refused with the exact reason, the field named, context.state untouched
  (pickles, non-numeric dtypes, a non-bytes value, a header whose shape the bytes do not hold, so
  nothing is allocated for it, an array in two places);
- the central node packs only for a node that said it reads that type, unpacks only the replies to
  packed requests, refuses a malformed packed reply naming the party, and a whole run is bitwise
  the run with packing off, also with one party that does not read packed messages.
"""

import io
import pickle

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.serde import context_from_proto, context_to_proto
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from _party_handlers import N, RC, _task_identity  # noqa: F401 (fixture)
from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.clients import party_public
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io.wire import PACK_MAX_BYTES, PACKED_FIELD, is_packed, pack, packed_types, unpack
from flower_vfl.strategies.exchange import Exchange, ReplyError

HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}


def _request(n=N, rnd=1, seed=0, dtype=np.float64, k=None):
    rng = np.random.default_rng(seed)
    shape = (n,) if k is None else (n, k)
    return RecordDict({"vectors": ArrayRecord({"q": Array((rng.normal(size=shape) * 0.1).astype(dtype)),
                                               "y": Array((rng.normal(size=shape) * 1e-4).astype(dtype))}),
                       "config": ConfigRecord({"round": rnd, "rho": 1e-3, "alpha": 1.0, "theta": 0.5})})


def _arrays(content):
    return {(name, k): rec[k].numpy() for name, rec in content.array_records.items() for k in rec}


def _same_arrays(a, b):
    a, b = _arrays(a), _arrays(b)
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                        and np.array_equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------ the codec
@pytest.mark.parametrize("dtype,k", [(np.float64, None), (np.float32, None), (np.float64, 3)])
def test_pack_unpack_is_exact_and_cuts_flowers_objects(dtype, k):
    content = _request(dtype=dtype, k=k)
    packed = pack(content, "config")
    assert list(packed.keys()) == ["config"] and is_packed(packed, "config")
    assert len(get_all_nested_objects(content)) == 7 and len(get_all_nested_objects(packed)) == 2
    back = unpack(packed, "config", ValueError, "party 1")
    assert _same_arrays(back, content)
    assert dict(back["config"]) == dict(content["config"])          # the scalars, the same and no more
    reply = RecordDict({"release": ArrayRecord({"s": Array(np.arange(N, dtype=np.uint64) * 2**40)}),
                        "meta": MetricRecord({"party": 1, "round": 1})})
    packed_reply = pack(reply, "packed")
    assert len(get_all_nested_objects(reply)) == 5 and len(get_all_nested_objects(packed_reply)) == 3
    assert _same_arrays(unpack(packed_reply, "packed", ValueError, "x"), reply)


def test_a_content_above_the_limit_or_without_arrays_is_not_packed():
    big = _request(n=PACK_MAX_BYTES // 16 + 1)
    assert pack(big, "config") is big
    small = RecordDict({"config": ConfigRecord({"round": 1})})
    assert pack(small, "config") is small
    assert unpack(small, "config", ValueError, "x") is small


def test_identify_says_which_types_the_party_reads_packed(tmp_path):
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 1, "state-dir": str(tmp_path)},
                  state=RecordDict(), run_config=dict(RC))
    rep = ca.identify(Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=7,
                              message_type="query.identify"), ctx)
    assert rep.content["identity"][PACKED_FIELD] == "train,evaluate"
    assert packed_types(rep.content["identity"]) == {"train", "evaluate"}
    assert packed_types({PACKED_FIELD: 3}) == frozenset() and packed_types({}) == frozenset()


# ------------------------------------------------------------------------------ the party
def _context(tmp_path, name):
    return Context(run_id=1, node_id=7, node_config={"partition-id": 1, "state-dir": str(tmp_path / name)},
                   state=RecordDict(), run_config=dict(RC))


def _send(context, content, mtype="train"):
    """One message in a fresh process (empty solver cache, context through Flower's proto)."""
    party_public._SOLVERS.clear()
    context = context_from_proto(context_to_proto(context))
    rep = getattr(ca, mtype)(Message(content, dst_node_id=7, message_type=mtype), context)
    return rep, context_from_proto(context_to_proto(context))


def _state(context):
    return {(name, k): bytes(rec[k].data) if hasattr(rec[k], "data") else rec[k]
            for name, rec in context.state.items() for k in rec}


def test_a_packed_request_gets_a_packed_reply_bitwise_the_unpacked_one(tmp_path):
    plain_ctx, packed_ctx = _context(tmp_path, "a"), _context(tmp_path, "b")
    for rnd in (1, 2, 3):
        content = _request(rnd=rnd, seed=rnd)
        rep_plain, plain_ctx = _send(plain_ctx, content)
        rep_packed, packed_ctx = _send(packed_ctx, pack(content, "config"))
        assert "release" in rep_plain.content and "release" not in rep_packed.content
        assert is_packed(rep_packed.content, "packed")
        decoded = unpack(rep_packed.content, "packed", ValueError, "x")
        assert _same_arrays(decoded, rep_plain.content)
        assert dict(decoded["meta"]) == dict(rep_plain.content["meta"])
        assert _state(packed_ctx) == _state(plain_ctx)
    # evaluate: the held-out scores, packed the same way (no vectors in the request: unpacked)
    ev = RecordDict({"config": ConfigRecord({"round": 3, "rho": 1e-3, "alpha": 1.0, "theta": 0.5})})
    rep_ev, _ = _send(packed_ctx, ev, "evaluate")
    assert "release" in rep_ev.content and not is_packed(rep_ev.content, "packed")


def _refusal(rep):
    rec = rep.content["refusal"]
    return rec["reason"], rec.get("field"), rec["code"]


def _header(shape):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _npy(a, allow_pickle=False):
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_the_shared_npy_header_reader_is_numpys(version):
    # flower_vfl.io.npy.read_npy_header reads packed fields (here) and the block cache's mapped
    # members (party_cache._mapped_npz): NumPy's reader for the version, the offset where data starts
    from flower_vfl.io.npy import read_npy_header
    a = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=version)
    raw = buf.getvalue()
    shape, fortran, dtype, offset = read_npy_header(io.BytesIO(raw))
    assert (shape, fortran, dtype) == ((3, 4), True, np.dtype(np.float32))
    assert offset == len(raw) - a.nbytes
    assert np.array_equal(np.frombuffer(raw, np.float32, offset=offset).reshape(4, 3).T, a)
    big = io.BytesIO()                                  # a header above NumPy's default limit
    np.lib.format.write_array_header_2_0(big, {"descr": "<f8", "fortran_order": False, "shape": (1,) * 4000})
    with pytest.raises(ValueError, match="max_header_size"):
        read_npy_header(io.BytesIO(big.getvalue()))
    assert read_npy_header(io.BytesIO(big.getvalue()), max_header_size=1 << 16)[0] == (1,) * 4000


@pytest.mark.parametrize("value,reason", [
    # a pickle's first bytes (protocol 4, a frame): never unpickled, refused at the magic string
    (b"\x80\x04\x95" + bytes(13), "party 1: packed field 'config.vectors/q' is not a NumPy array "
     "(the magic string is not correct; expected b'\\x93NUMPY', got b'\\x80\\x04\\x95\\x00\\x00\\x00')"),
    (_npy(np.array([{"a": 1}] * N, dtype=object), allow_pickle=True),
     "party 1: packed field 'config.vectors/q' has dtype object; expected one of float64, float32, uint64, int64"),
    (_npy(np.array(["a"] * N)), "party 1: packed field 'config.vectors/q' has dtype <U1; expected one of float64, "
                                "float32, uint64, int64"),
    ("not bytes", "party 1: packed field 'config.vectors/q' is a str, not bytes"),
    (_npy(np.zeros(N))[:-8], f"party 1: packed field 'config.vectors/q' declares shape ({N},) ({8 * N} bytes) but "
                             f"holds {8 * N - 8} bytes after its header"),
    (_header((10**12,)) + bytes(80), "party 1: packed field 'config.vectors/q' declares shape (1000000000000,) "
                                     "(8000000000000 bytes) but holds 80 bytes after its header"),
], ids=["pickle", "object-array", "strings", "str", "short", "huge-header"])
def test_what_does_not_decode_is_refused_and_changes_nothing(tmp_path, value, reason):
    ctx = _context(tmp_path, "p")
    _, ctx = _send(ctx, pack(_request(rnd=1), "config"))
    before = _state(ctx)
    bad = pack(_request(rnd=2), "config")
    cfg = dict(bad["config"])
    cfg["vectors/q"] = value
    rep, ctx = _send(ctx, RecordDict({"config": ConfigRecord(cfg)}))
    assert _refusal(rep) == (reason, None, "invalid")
    assert _state(ctx) == before


def test_an_array_in_two_places_is_refused(tmp_path):
    ctx = _context(tmp_path, "p")
    content = _request(rnd=1)
    packed = pack(content, "config")
    both = RecordDict({"config": packed["config"], "vectors": content["vectors"]})
    rep, ctx = _send(ctx, both)
    assert _refusal(rep) == ("party 1: packed field 'config.vectors/q' names record 'vectors', which the message "
                             "also has; refused (one place per array)", None, "invalid")
    assert party_public.STATE_ARRAYS not in ctx.state


# ------------------------------------------------------------------------------ the central node
def _run(monkeypatch, pack_requests=True, old_party=None, rounds=6, spy=None):
    """breast cancer, 2 parties, on the in-process grid; ``old_party``: that node's identify does
    not say it reads packed messages (a party of another app)."""
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": rounds, "tol": 0.0}
    handlers = dict(HANDLERS)

    def identify(msg, context):
        rep = ca.identify(msg, context)
        if context.node_id == old_party:
            info = dict(rep.content["identity"])
            del info[PACKED_FIELD]
            rep.content["identity"] = ConfigRecord(info)
        return rep
    handlers["query.identify"] = identify
    grid = LocalGrid(handlers, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc,
                     on_reply=spy)
    st = sa.make_strategy(rc)
    monkeypatch.setattr(Exchange, "pack_requests", pack_requests)
    st.start(grid)
    return st


def test_a_run_is_bitwise_the_run_without_packing_and_packs_only_for_parties_that_read_it(monkeypatch):
    seen = []
    st_packed = _run(monkeypatch, spy=lambda msg, rep: seen.append((msg.metadata.dst_node_id, msg.metadata.message_type,
                                                       is_packed(msg.content, "config"),
                                                       is_packed(rep.content, "packed"))))
    st_plain = _run(monkeypatch, pack_requests=False)
    st_mixed = _run(monkeypatch, old_party=101, spy=lambda msg, rep: seen.append(
        ("mixed", msg.metadata.dst_node_id, msg.metadata.message_type, is_packed(msg.content, "config"))))
    ref = [r["objective"] for r in st_plain.history_]
    assert [r["objective"] for r in st_packed.history_] == ref
    assert [r["objective"] for r in st_mixed.history_] == ref
    assert np.array_equal(st_packed.decision_test_, st_plain.decision_test_)
    trains = [s for s in seen if s[0] != "mixed" and s[1] == "train"]
    assert len(trains) == 12 and all(s[2] and s[3] for s in trains)
    assert all(not s[2] for s in seen if s[0] != "mixed" and s[1] == "query.identify")
    mixed = [s for s in seen if s[0] == "mixed" and s[2] == "train"]
    assert {(s[1], s[3]) for s in mixed} == {(100, True), (101, False)}


def test_a_malformed_packed_reply_is_refused_naming_the_party():
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 3, "tol": 0.0}

    def train(msg, context):
        rep = ca.train(msg, context)
        if context.node_id == 101:
            cfg = dict(rep.content["packed"])
            cfg["release/s"] = pickle.dumps(np.zeros(3))
            rep.content["packed"] = ConfigRecord(cfg)
        return rep
    grid = LocalGrid({**HANDLERS, "train": train}, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc)
    with pytest.raises(ReplyError) as err:
        sa.make_strategy(rc).start(grid)
    assert str(err.value).startswith("party 1 (node 101), the reply to the round 1 (train) request: packed field "
                                     "'packed.release/s' is not a NumPy array (")


def test_a_packed_reply_to_an_unpacked_request_is_not_read(monkeypatch):
    rc = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 3, "tol": 0.0}

    def train(msg, context):
        rep = ca.train(msg, context)
        return Message(pack(rep.content, "packed"), reply_to=msg)
    grid = LocalGrid({**HANDLERS, "train": train}, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc)
    monkeypatch.setattr(Exchange, "pack_requests", False)
    with pytest.raises(ReplyError) as err:
        sa.make_strategy(rc).start(grid)
    assert str(err.value) == ("party 0 (node 100), round 1 (train): the reply has no 'release' record "
                              "(records: ['meta', 'packed'])")
