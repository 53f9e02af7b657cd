"""What a party must not lose lives on its own disk, not in context.state (issue 24 item 4).

On a real SuperNode Flower pushes context.state back in the ClientApp's exit handler and force-ends
it 5 s later: a large state can miss that push, and the node's next message then starts from the
state before (or an empty one). Through the real ClientApp handlers, a fresh Context per run and
the context put through Flower's own proto round trip between messages (as the SuperNode stores
it):

- secure aggregation: with the context of the message that answered round k lost (reverted, or
  wiped whole), the party still refuses round k in a sum over another set of names (the exact
  refusal) and still returns the same masked bytes to an identical request; an earlier version's
  entries in context.state are honoured and moved to the store; the store keeps the answers of
  the last 4 runs only;
- a non-private party: a factorization above 4 MiB (d = 800: 5.1 MB) and z_loc of a relaxed run
  above 4 MiB (N = 600,000: 4.8 MB) go to the state folder; the serialized context stays under
  64 KiB; the releases are bitwise those of an in-process party that keeps every array; a missing
  or altered factorization file is recomputed (bitwise the same releases), a missing or altered
  z_loc file refuses the relaxed round (exact text) and nothing else; old runs' files are deleted;
  a deployed node without state-dir refuses to keep a large array anywhere else.
"""

import sqlite3

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.serde import context_from_proto, context_to_proto

from _party_handlers import RC, _task_identity  # noqa: F401 (fixture)
from flower_vfl.apps import client as ca
from flower_vfl.clients import party_public, party_secagg
from flower_vfl.core import xsolve
from flower_vfl.core.party import PartyUpdate
from flower_vfl.core.penalties import get_penalty
from flower_vfl.io import party_arrays
from flower_vfl.io.data import party_block
from flower_vfl.privacy import store as store_mod

MiB = 1 << 20


def _trip(context):
    """The context as the SuperNode stores and hands it (Flower's proto round trip)."""
    return context_from_proto(context_to_proto(context))


def _size(context) -> int:
    return len(context_to_proto(context).SerializeToString())


def _fresh_process():
    party_public._SOLVERS.clear()
    party_public._FACTOR_FILES.clear()


# =============================================================== secure aggregation
SA_RC = {"dataset": "breast_cancer", "num-parties": 3, "lam": 1e-3, "secagg": True}


def _sa_contexts(tmp_path, run_id=1):
    return [Context(run_id=run_id, node_id=100 + i,
                    node_config={"partition-id": i, "state-dir": str(tmp_path / f"p{i}")},
                    state=RecordDict(), run_config=dict(SA_RC)) for i in range(3)]


def _advert(c):
    rep = ca.secagg_keys(Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=c.node_id,
                                 message_type="query.secagg_keys"), c)
    return rep.content["secagg"]["advert"]


def _sa_msg(c, adverts, names, rnd, seed=0):
    n = party_block("breast_cancer", int(c.node_config["partition-id"]), 3)[0].shape[0]
    rng = np.random.default_rng(seed)
    rd = RecordDict({"vectors": ArrayRecord({"q": Array(rng.normal(size=n) * 0.1),
                                             "y": Array(rng.normal(size=n) * 1e-3)}),
                     "config": ConfigRecord({"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 0.5,
                                             "secagg.adverts": list(adverts), "secagg.parties": list(names)})})
    return Message(rd, dst_node_id=c.node_id, message_type="train")


def _train(context, msg):
    """One train message in a fresh process: (reply, the context the node then holds)."""
    _fresh_process()
    context = _trip(context)
    rep = ca.train(msg, context)
    return rep, _trip(context)


ALL3, TWO = ["party0", "party1", "party2"], ["party0", "party1"]
SUBTRACT = ("party 'party0': round 1 (train) was already answered in a sum over [party0,party1,party2]; "
            "refused in a sum over [party0,party1] (the central node could subtract the two sums)")


def _refusal(rep):
    assert "release" not in rep.content
    return rep.content["refusal"]["code"], rep.content["refusal"]["reason"]


def test_secagg_guard_survives_a_lost_context_push(tmp_path):
    ctxs = [_trip(c) for c in _sa_contexts(tmp_path)]
    adverts = [_advert(c) for c in ctxs]
    ctxs = [_trip(c) for c in ctxs]
    before = ctxs[0]                        # what the node holds when round 1 arrives
    rep, after = _train(before, _sa_msg(before, adverts, ALL3, 1))
    first = rep.content["release"]["s"].numpy()
    assert first.dtype == np.uint64
    # nothing of the guard in context.state: the masked answer (8 N bytes) and the sums are on disk
    assert not [k for k in after.state if k.startswith(("vfl.secagg.masked", "vfl.secagg.answer",
                                                        "vfl.secagg.sums"))]
    assert _size(after) < 16 << 10
    # the push of that context is lost: the node's next message starts from `before`
    again, _ = _train(before, _sa_msg(before, adverts, ALL3, 1))
    assert np.array_equal(again.content["release"]["s"].numpy(), first)          # bitwise the same bytes
    other, kept = _train(before, _sa_msg(before, adverts, TWO, 1))
    assert _refusal(other) == ("secagg-replay", SUBTRACT)
    # another broadcast for round 1: refused as before (one masked answer per round)
    changed, _ = _train(before, _sa_msg(before, adverts, ALL3, 1, seed=5))
    assert _refusal(changed) == ("secagg-replay", "round 1 (train) was already answered for another broadcast "
                                                  "in this run; refused (one masked answer per round)")


def test_secagg_guard_survives_a_wiped_context_and_a_new_key(tmp_path):
    ctxs = [_trip(c) for c in _sa_contexts(tmp_path)]
    adverts = [_advert(c) for c in ctxs]
    rep, _ = _train(ctxs[0], _sa_msg(ctxs[0], adverts, ALL3, 1))
    assert "release" in rep.content
    wiped = _sa_contexts(tmp_path)[0]                         # the node lost everything (a restart)
    lost, _ = _train(wiped, _sa_msg(wiped, adverts, ALL3, 1))
    assert _refusal(lost) == ("secagg-rekey", "party 'party0' holds no secure-aggregation key for run 1 (a "
                                              "restarted node): the central node must ask for its advert again "
                                              "(query.secagg_keys) and relay a new roster; refused")
    new = [_advert(wiped)] + adverts[1:]                      # re-keyed: a new roster, new masks
    assert new[0] != adverts[0]
    other, _ = _train(wiped, _sa_msg(wiped, new, TWO, 1))
    assert _refusal(other) == ("secagg-replay", SUBTRACT)      # whatever the keys


def test_an_earlier_versions_entries_in_context_state_are_honoured_and_moved(tmp_path):
    ctxs = [_trip(c) for c in _sa_contexts(tmp_path)]
    adverts = [_advert(c) for c in ctxs]
    c = ctxs[0]
    c.state[party_secagg.STATE_SUMS] = ConfigRecord({"train/1": "party0,party1,party2"})
    other, c = _train(c, _sa_msg(c, adverts, TWO, 1))
    assert _refusal(other) == ("secagg-replay", SUBTRACT)
    ok, c = _train(c, _sa_msg(c, adverts, ALL3, 2, seed=2))
    assert "release" in ok.content and party_secagg.STATE_SUMS not in c.state
    st = store_mod.party_store(str(tmp_path / "p0"))
    assert st.secagg_sums("partition:0/name:party0", "1") == {"train/1": "party0,party1,party2",
                                                              "train/2": "party0,party1,party2"}


def test_the_store_keeps_the_answers_of_the_last_four_runs_and_every_sums_record(tmp_path):
    st = store_mod.PartyStore(tmp_path / "s")
    owner, never = "partition:0/name:party0", lambda recorded, prior: False
    for run in range(1, 7):
        for kind in ("train", "evaluate"):
            st.commit_secagg(owner, run, kind, f"k{run}", b"d" * 32, np.arange(3, dtype=np.uint64) + run,
                             {f"{kind}/1": "a,b"}, never, plain=(1, np.full(3, 0.5 * run)))
    held = {r for (r,) in st._db.execute("SELECT run FROM secagg_answers")}
    assert held == {"3", "4", "5", "6"} and store_mod.SECAGG_KEEP_RUNS == 4
    assert {r for (r,) in st._db.execute("SELECT DISTINCT run FROM secagg_sums")} == {str(r) for r in range(1, 7)}
    assert np.array_equal(st.secagg_masked(owner, 6, "train", "k6"), [6, 7, 8])
    assert st.secagg_masked(owner, 2, "train", "k2") is None
    assert st.secagg_plain(owner, 6, "evaluate")[0] == 1 and np.array_equal(st.secagg_plain(owner, 6, "evaluate")[1],
                                                                             [3.0, 3.0, 3.0])
    st.close()


# =============================================================== a non-private party's large arrays
def _block(n, d, seed=0):
    rng = np.random.default_rng(seed)
    D = rng.normal(size=(n, d))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    return D, D[:5].copy()


@pytest.fixture
def block(monkeypatch):
    """The ClientApp's party block replaced by a synthetic one of the shape the test asks for."""
    holder = {}
    monkeypatch.setattr(ca, "cached_party_block", lambda *a, **k: holder["D"])
    return holder


def _pub_context(tmp_path, run_id=1, state_dir=True, **rc):
    nc = {"partition-id": 1, **({"state-dir": str(tmp_path / "p1")} if state_dir else {})}
    return Context(run_id=run_id, node_id=7, node_config=nc, state=RecordDict(), run_config={**RC, **rc})


def _pub_msg(n, rnd, seed, alpha=1.0):
    rng = np.random.default_rng(seed)
    rd = RecordDict({"config": ConfigRecord({"round": rnd, "rho": 1e-3, "alpha": alpha, "theta": 0.5}),
                     "vectors": ArrayRecord({"q": Array(rng.normal(size=n) * 0.1),
                                             "y": Array(rng.normal(size=n) * 1e-4)})})
    return Message(rd, dst_node_id=7, message_type="train")


def _reference(D, rounds, alpha=1.0, lam=RC["lam"]):
    """The releases of an in-process party that keeps every array (the code before this change)."""
    party = PartyUpdate(D, get_penalty("l2"), lam, x_solver="auto", center=True)
    out = []
    for r in rounds:
        m = _pub_msg(D.shape[0], r, r, alpha)
        out.append(party.train_release(r, *(m.content["vectors"][k].numpy() for k in ("q", "y")), 1e-3, alpha, 0.5))
    return out


def _count_grams(monkeypatch):
    grams = []
    real = xsolve.XSolver.gram
    monkeypatch.setattr(xsolve.XSolver, "gram", lambda self: grams.append(1) or real(self))
    return grams


def _factor_files(tmp_path):
    return sorted((tmp_path / "p1" / "party-arrays" / "shared").glob("factor-*.npz"))


def test_a_wide_blocks_factorization_is_kept_on_disk_and_the_releases_are_bitwise(tmp_path, monkeypatch, block):
    block["D"] = _block(1200, 800)
    ref = _reference(block["D"][0], range(4))
    grams = _count_grams(monkeypatch)
    context = _pub_context(tmp_path)
    for r in range(4):
        rep, context = _train(context, _pub_msg(1200, r, r))
        assert np.array_equal(rep.content["release"]["s"].numpy(), ref[r])
    assert len(grams) == 1                            # factorized once, read back by every fresh process
    rec = context.state[party_public.STATE_FACTOR]
    assert sorted(rec.keys()) == ["key", "sha"]        # 8 (d^2 + d) = 5.1 MB is not in context.state
    [f] = _factor_files(tmp_path)
    assert f.stat().st_size > 5_120_000 and f.name.endswith(bytes(rec["sha"].numpy()).hex() + ".npz")
    assert _size(context) < 64 << 10 < 4 * MiB
    # a new run of the same block and parameters finds the file (named by the solver's key)
    ctx2 = _pub_context(tmp_path, run_id=2)
    rep, ctx2 = _train(ctx2, _pub_msg(1200, 0, 0))
    assert len(grams) == 1 and np.array_equal(rep.content["release"]["s"].numpy(), ref[0])


@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_a_missing_or_altered_factorization_file_is_recomputed_bitwise(tmp_path, monkeypatch, block, damage):
    block["D"] = _block(1200, 800)
    ref = _reference(block["D"][0], range(3))
    grams = _count_grams(monkeypatch)
    context = _pub_context(tmp_path)
    rep, context = _train(context, _pub_msg(1200, 0, 0))
    [f] = _factor_files(tmp_path)
    if damage == "missing":
        f.unlink()
    else:
        raw = bytearray(f.read_bytes())
        raw[-9] ^= 1                                       # one bit of V
        f.write_bytes(bytes(raw))
    for r in (1, 2):
        rep, context = _train(context, _pub_msg(1200, r, r))
        assert np.array_equal(rep.content["release"]["s"].numpy(), ref[r])
    assert len(grams) == 2                                  # recomputed once, then read back again
    [g] = _factor_files(tmp_path)
    assert g.name.endswith(bytes(context.state[party_public.STATE_FACTOR]["sha"].numpy()).hex() + ".npz")


N_BIG = 600_000                                             # z_loc: 4.8 MB > 4 MiB


def _zloc_file(tmp_path, run=1):
    return sorted((tmp_path / "p1" / "party-arrays" / f"run-{run}").glob("party1-z_loc-*.npz"))


def test_a_relaxed_runs_z_share_is_kept_on_disk_and_the_releases_are_bitwise(tmp_path, block):
    block["D"] = _block(N_BIG, 4)
    context = _pub_context(tmp_path)
    ref = _reference(block["D"][0], range(3), alpha=1.5)
    for r in range(3):
        rep, context = _train(context, _pub_msg(N_BIG, r, r, alpha=1.5))
        assert np.array_equal(rep.content["release"]["s"].numpy(), ref[r])
        assert _size(context) < 64 << 10
    arrays = context.state[party_public.STATE_ARRAYS]
    assert sorted(arrays.keys()) == ["rho_x", "x"]
    sha = context.state[party_public.STATE_DISK]["z_loc"]
    files = _zloc_file(tmp_path)
    assert len(files) == 2 and any(f.name.endswith(f"-{sha}.npz") for f in files)   # this round's and the one before
    # an identical re-send: the same vector, nothing changed
    again, after = _train(context, _pub_msg(N_BIG, 2, 2, alpha=1.5))
    assert np.array_equal(again.content["release"]["s"].numpy(), ref[2])
    assert after.state[party_public.STATE_DISK]["z_loc"] == sha


ZLOC_LOST = ("party 1: train round 2 asks for over-relaxation (alpha=1.5), and its share of z from the round "
             "before, kept in its state folder, is missing or does not match the SHA-256 kept in context.state; "
             "refused (the relaxed x-update needs it; a round with alpha=1 does not)")


@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_a_missing_or_altered_z_share_refuses_the_relaxed_round_only(tmp_path, block, damage):
    block["D"] = _block(N_BIG, 4)
    context = _pub_context(tmp_path)
    for r in range(2):
        _, context = _train(context, _pub_msg(N_BIG, r, r, alpha=1.5))
    sha = context.state[party_public.STATE_DISK]["z_loc"]
    [f] = [f for f in _zloc_file(tmp_path) if f.name.endswith(f"-{sha}.npz")]
    if damage == "missing":
        f.unlink()
    else:
        raw = bytearray(f.read_bytes())
        raw[-1] ^= 1
        f.write_bytes(bytes(raw))
    before = context_to_proto(context).SerializeToString()
    rep, after = _train(context, _pub_msg(N_BIG, 2, 2, alpha=1.5))
    assert _refusal(rep) == ("refused", ZLOC_LOST) and rep.content["refusal"]["field"] == "config.alpha"
    assert context_to_proto(after).SerializeToString() == before            # nothing changed
    ok, after = _train(after, _pub_msg(N_BIG, 2, 2, alpha=1.0))              # alpha = 1 does not read it
    assert "release" in ok.content and party_public.STATE_DISK not in after.state


def test_the_state_folder_keeps_the_last_four_runs_and_four_factorizations(tmp_path, monkeypatch):
    """breast cancer with the limit lowered to 1 KiB: z_loc (4.5 kB) and the factorization (1.9 kB)
    go to disk; six runs, each at another lam (another factorization key)."""
    monkeypatch.setattr(party_public, "STATE_DISK_MIN_BYTES", 1024)
    base = tmp_path / "p1" / "party-arrays"
    for run in range(1, 7):
        context = _pub_context(tmp_path, run_id=run, lam=10.0 ** -run)
        for r in range(3):
            rep, context = _train(context, _pub_msg(party_block("breast_cancer", 1, 2)[0].shape[0], r, r, 1.5))
            assert "release" in rep.content
        assert len(_zloc_file(tmp_path, run)) == 2
    assert sorted(p.name for p in base.glob("run-*")) == ["run-3", "run-4", "run-5", "run-6"]
    assert len(_factor_files(tmp_path)) == party_arrays.KEEP_SHARED == 4


def test_a_deployed_node_without_state_dir_refuses_to_keep_a_large_array_elsewhere(tmp_path, monkeypatch, block):
    monkeypatch.delenv("FLOWER_VFL_STATE_DIR")
    monkeypatch.setattr(store_mod, "deployed_supernode", lambda: True)
    block["D"] = _block(N_BIG, 4)
    for r in range(2):                                                        # small state only: fine
        rep, _ = _train(_pub_context(tmp_path, state_dir=False), _pub_msg(N_BIG, r, r, alpha=1.0))
        assert "release" in rep.content
    with pytest.raises(store_mod.StateDirRequired, match=r"party 1's state array\(s\) \['z_loc'\] is too large to "
                                                         r"travel in context.state .*node config has no state-dir"):
        _train(_pub_context(tmp_path, run_id=2, state_dir=False), _pub_msg(N_BIG, 0, 0, alpha=1.5))


def test_without_a_state_folder_a_large_factorization_is_not_kept_and_the_releases_are_bitwise(
        tmp_path, monkeypatch, block):
    """The factorization is only a cache: a deployed node without state-dir answers every round
    (bitwise), factorizing in each message, and keeps it neither on disk nor in context.state."""
    monkeypatch.delenv("FLOWER_VFL_STATE_DIR")
    monkeypatch.setattr(store_mod, "deployed_supernode", lambda: True)
    block["D"] = _block(1200, 800)
    ref = _reference(block["D"][0], range(3))
    grams = _count_grams(monkeypatch)
    context = _pub_context(tmp_path, state_dir=False)
    for r in range(3):
        rep, context = _train(context, _pub_msg(1200, r, r))
        assert np.array_equal(rep.content["release"]["s"].numpy(), ref[r])
    assert len(grams) == 3 and party_public.STATE_FACTOR not in context.state
    assert _size(context) < 64 << 10 and not list(tmp_path.rglob("*.npz"))


# a party that lost its iterate and is asked an answered round again under new keys
def _answered_then_wiped(tmp_path, nc=None):
    ctxs = [_trip(c) for c in _sa_contexts(tmp_path)]
    if nc:
        for c in ctxs:
            c.node_config.update(nc)
    adverts = [_advert(c) for c in ctxs]
    c = ctxs[0]
    firsts = []
    for rnd in (1, 2):
        rep, c = _train(c, _sa_msg(c, adverts, ALL3, rnd, seed=rnd))
        assert "release" in rep.content
        firsts.append(rep.content["release"]["s"].numpy())
    wiped = _sa_contexts(tmp_path)[0]                         # a restart: keys, meta and iterate gone
    if nc:
        wiped.node_config.update(nc)
    return wiped, [_advert(wiped)] + adverts[1:], firsts


def test_a_restarted_public_party_does_not_answer_an_answered_round_with_another_value(tmp_path):
    """After a restart the party computes round 2 from x = 0: another s_m than it answered. Masked
    under new keys in a sum over the same names, the difference of the two sums would be the
    difference of its two releases (the rest are the same); refused. Round 1 (no longer its last
    answer) too; a new round is answered."""
    wiped, new, _ = _answered_then_wiped(tmp_path)
    again, c = _train(wiped, _sa_msg(wiped, new, ALL3, 2, seed=2))
    code, reason = _refusal(again)
    assert code == "secagg-replay" and reason.startswith(
        "party 'party0': round 2 (train) was already answered with another value (max |difference| ")
    assert reason.endswith("); refused (the difference of the two sums would be the difference of two of its "
                           "releases)")
    older, c = _train(c, _sa_msg(c, new, ALL3, 1, seed=1))
    assert _refusal(older) == ("secagg-replay", "party 'party0': round 1 (train) was already answered, and the value "
                                                "it answered is no longer kept (this party answered a later round "
                                                "since, or lost its store); refused (another value in a second sum "
                                                "would give the central node the difference of two of its releases)")
    fresh, _ = _train(c, _sa_msg(c, new, ALL3, 3, seed=3))
    assert "release" in fresh.content


def test_a_restarted_private_party_answers_an_answered_round_with_its_stored_release(tmp_path):
    """A private party's release of a round comes from its ledger: asked round 2 again under new
    keys it gives the same value (masked under the new keys), so it is answered."""
    dp = {"dp": True, "dp-epsilon": 4.0, "dp-delta": 1e-5, "dp-train-rounds": 3, "dp-eval-rounds": 1}
    wiped, new, _ = _answered_then_wiped(tmp_path, dp)
    again, _ = _train(wiped, _sa_msg(wiped, new, ALL3, 2, seed=2))
    assert "release" in again.content and again.content["release"]["s"].numpy().dtype == np.uint64


def _open_at_once(args):
    kind, folder, barrier = args
    from flower_vfl.io.psi_log import PsiLog
    barrier.wait()
    try:
        (store_mod.PartyStore if kind == "store" else PsiLog)(folder).close()
        return "ok"
    except Exception as exc:             # the failure these tests are about
        return f"{type(exc).__name__}: {exc}"


def _six_open_at_once(kind, tmp_path, trials):
    """``trials`` times, 6 processes open the same new file in a fresh folder together."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    for trial in range(trials):
        folder = tmp_path / f"shared{trial}"
        with ctx.Manager() as manager:
            barrier = manager.Barrier(6)
            with ctx.Pool(6) as pool:
                got = pool.map(_open_at_once, [(kind, str(folder), barrier)] * 6)
        assert got == ["ok"] * 6


def test_parties_sharing_a_folder_open_a_new_store_at_once(tmp_path):
    """Simulated parties share one state folder (one operator) and open its store at the same time
    (a secure-aggregation round): none may see a new file's tables before its schema version. Before
    the version check and the tables were one transaction, 3 loopback parties hit it: 'written by
    another flower-vfl version (schema 0 ...)'."""
    _six_open_at_once("store", tmp_path, 4)


def test_parties_sharing_a_folder_open_a_new_psi_log_at_once(tmp_path):
    """Simulated parties share one state folder and answer the PSI request at the same time, so
    they open a new psi-log.sqlite at once. Switching a new file to WAL is refused at once by
    SQLite (no busy wait) while another process opens it: before open_journaled tried again, CI
    failed a simulation with 'database is locked' (3 of 30 such trials on this machine)."""
    _six_open_at_once("psi-log", tmp_path, 8)


class _LockedThen:
    """A connection whose PRAGMA journal_mode=WAL is refused ``n`` times with ``error``."""

    def __init__(self, n, error="database is locked"):
        self.n, self.error, self.calls = n, error, 0

    def execute(self, sql):
        assert sql == "PRAGMA journal_mode=WAL"
        self.calls += 1
        if self.calls <= self.n:
            raise sqlite3.OperationalError(self.error)


def test_wal_switch_tries_again_only_while_locked_and_only_until_its_timeout(monkeypatch):
    """The ledger, the PSI log and the label store all switch to WAL through store._wal: a lock
    is waited out (3 refusals, then on), any other error is raised at once, and a lock that
    outlasts the timeout is raised as SQLite's own error."""
    monkeypatch.setattr(store_mod.time, "sleep", lambda s: None)
    db = _LockedThen(3)
    store_mod._wal(db, 30.0)
    assert db.calls == 4
    db = _LockedThen(1, "disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="^disk I/O error$"):
        store_mod._wal(db, 30.0)
    assert db.calls == 1
    db = _LockedThen(10**9)
    with pytest.raises(sqlite3.OperationalError, match="^database is locked$"):
        store_mod._wal(db, 0.05)
    assert db.calls >= 2


def test_a_locked_count_is_read_again_not_reported_as_lost_rows(tmp_path, monkeypatch):
    """`flower-vfl ledger` counts each journaled file's rows (store.count_journal_losses). A read
    that meets SQLite's at-once lock refusal is tried again (the file's real count: no loss), and
    one still locked after 30 s raises: it was reported as a file holding 0 rows (a loss)."""
    import types
    from flower_vfl.io.psi_log import PsiLog
    log = PsiLog(tmp_path)
    log.record("file.csv#id=id", "request", [b"a", b"b", b"c"], 3, 1.0)   # rows, and a journal that counts them
    log.close()
    clock = {"t": 0.0}
    monkeypatch.setattr(store_mod, "time", types.SimpleNamespace(
        monotonic=lambda: clock["t"], sleep=lambda s: clock.__setitem__("t", clock["t"] + s)))
    real, refusals = store_mod.CountJournal.count, {"left": 3}

    def count(self, db):
        if refusals["left"]:
            refusals["left"] -= 1
            raise sqlite3.OperationalError("database is locked")
        return real(self, db)
    monkeypatch.setattr(store_mod.CountJournal, "count", count)
    assert store_mod.CountJournal(tmp_path / "psi-log.sqlite", "asked", "").last() > 0
    assert store_mod.count_journal_losses(tmp_path) == [] and refusals["left"] == 0
    refusals["left"] = 10**9
    with pytest.raises(sqlite3.OperationalError, match="^database is locked$"):
        store_mod.count_journal_losses(tmp_path)
    assert clock["t"] > 30.0
