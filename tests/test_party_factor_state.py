"""A non-private party keeps its x-update's factorization in its own context.state: on a real
SuperNode every message is a fresh (forked) process whose solver cache is empty. Through the real
ClientApp handlers, with the per-process cache emptied before every message (as a fresh process
has it): the Gram is factorized once, at the first message; the releases are bitwise those of a
party that re-factorizes every time; a factorization kept under another key is not used."""

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from _party_handlers import N, RC, _task_identity  # noqa: F401 (fixture)
from flower_vfl.apps import client as ca
from flower_vfl.clients import party_public
from flower_vfl.core import xsolve


def _msg(rnd, seed):
    rng = np.random.default_rng(seed)
    rd = RecordDict({"config": ConfigRecord({"round": rnd, "rho": 1e-3, "alpha": 1.0, "theta": 0.5}),
                     "vectors": ArrayRecord({"q": Array(rng.normal(size=N) * 0.1), "y": Array(rng.normal(size=N) * 1e-4)})})
    return Message(rd, dst_node_id=7, message_type="train")


def _run(tmp_path, monkeypatch, keep: bool, rounds=4, rc=RC, passes=None):
    grams = []
    real = xsolve.XSolver.gram
    monkeypatch.setattr(xsolve.XSolver, "gram", lambda self: grams.append(1) or real(self))
    stats = xsolve._column_stats
    monkeypatch.setattr(xsolve, "_column_stats", lambda *a, **k: (passes if passes is not None else []).append(1)
                        or stats(*a, **k))
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 1, "state-dir": str(tmp_path / "p1")},
                      state=RecordDict(), run_config=dict(rc))
    out = []
    for r in range(rounds):
        party_public._SOLVERS.clear()                       # a fresh process: the cache is empty
        if not keep and party_public.STATE_FACTOR in context.state:
            del context.state[party_public.STATE_FACTOR]
        rep = ca.train(_msg(r, r), context)
        out.append(rep.content["release"]["s"].numpy())
    return out, len(grams), context


def test_the_factorization_is_made_once_and_the_releases_are_bitwise_unchanged(tmp_path, monkeypatch):
    # the centring's column pass (xsolve._column_stats) is kept with it: made once too
    passes_kept, passes_fresh = [], []
    kept, n_kept, context = _run(tmp_path / "a", monkeypatch, keep=True, passes=passes_kept)
    n_passes_kept = len(passes_kept)
    fresh, n_fresh, _ = _run(tmp_path / "b", monkeypatch, keep=False, passes=passes_fresh)
    assert n_kept == 1 and n_fresh == 4
    assert n_passes_kept == 1 and len(passes_fresh) == 4
    assert all(np.array_equal(a, b) for a, b in zip(kept, fresh))
    rec = context.state[party_public.STATE_FACTOR]
    d = rec["V"].numpy().shape[0]
    assert sorted(rec.keys()) == ["V", "colsq", "colsum", "e", "key"] and rec["e"].numpy().shape == (d,)
    assert rec["colsq"].numpy().shape == rec["colsum"].numpy().shape == (d,)


def test_a_factorization_kept_under_another_key_is_not_used(tmp_path, monkeypatch):
    """A record whose key is not this block's and parameters' (another block, another penalty or
    lam: the key hashes them all) is ignored: the next fresh process factorizes again, and keeps
    its own."""
    _, _, context = _run(tmp_path / "a", monkeypatch, keep=True, rounds=1)
    rec = context.state[party_public.STATE_FACTOR]
    key = rec["key"].numpy()
    context.state[party_public.STATE_FACTOR] = ArrayRecord(
        {"key": Array(np.zeros_like(key)), "e": rec["e"], "V": rec["V"]})
    grams = []
    real = xsolve.XSolver.gram
    monkeypatch.setattr(xsolve.XSolver, "gram", lambda self: grams.append(1) or real(self))
    party_public._SOLVERS.clear()
    ca.train(_msg(1, 1), context)
    assert len(grams) == 1
    assert np.array_equal(context.state[party_public.STATE_FACTOR]["key"].numpy(), key)
