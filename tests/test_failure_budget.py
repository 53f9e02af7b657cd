"""No failure burns a budget (docs/privacy.md, "A failure does not spend the budget").

Through the real ClientApp handlers and the real strategies over an in-process grid, a fresh
``Context`` per node and run (each Flower run has its own run id, as a resumed or re-run run has):

- the ServerApp crashes right after the k-th message was delivered (its reply lost), for every k of
  the run, on each route with private parties (ADMM, ADMM under secure aggregation with every party
  private, moment, stacked-ssp); then the run is resumed (ADMM: ``resume=<state-dir>``) or re-run
  (the one-release routes): the model is the uninterrupted run's (to 1e-9) and every private
  party's ledger holds the same releases at the same noise multipliers, so the same exact epsilon;
- noise is drawn from a per-party counter in these tests (each draw takes the next seed), so a
  release drawn twice would change the model: the comparison shows there is no second draw;
- two runs at once against one private party's state-dir: the second is refused at identify,
  before any round, naming the running one (exact message); a reservation of a run that died and
  is never resumed lapses after the party's ``dp-plan-expiry``;
- a full disk at a private party's release, then space freed and ``resume``: the run continues its
  plan (no second charge, no new plan checked against what is left) and ends in the same ledger;
- under secure aggregation with non-private parties (the central node never sees their releases):
  a crash after every message, then a resume, gives the uninterrupted model, each party restoring its
  own state of the checkpoint's round from its state-dir under the run's resume token; a resume over
  another roster is refused by the parties, one without a party's state by the central node (exact
  messages); a non-private party restarted within the run stops it naming resume, and the resume
  ends in the uninterrupted model.
"""

import itertools
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord

from _party_handlers import _task_identity  # noqa: F401  (autouse fixture)
from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.clients.party_private import party_store
from flower_vfl.clients.source import declared_source
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.privacy import mechanism as mech
from flower_vfl.privacy import store as store_mod
from flower_vfl.strategies.exchange import ReplyError

ADMM_HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}
MOMENT_HANDLERS = {"query.moment_identify": ca.moment_identify, "query.moment_release": ca.moment_release,
                   "train.moment": ca.moment_train, "evaluate.moment": ca.moment_evaluate}
SSP_HANDLERS = {"query.ssp_identify": ca.ssp_identify, "query.ssp_release": ca.ssp_release}
DELTA = 1e-5


class Crash(Exception):
    """The ServerApp (or the SuperLink under it) dies."""


class CrashGrid(LocalGrid):
    """Delivers to the real handlers; after the ``crash_after``-th delivered message the ServerApp
    dies (its reply is lost). ``on_message(i, msg)`` runs before the i-th delivery (1-based)."""

    def __init__(self, handlers, node_configs, run_config, run_id, crash_after=None, on_message=None):
        super().__init__(handlers, node_configs, run_config, run_id=run_id)
        self.crash_after, self.on_message, self.delivered, self.types = crash_after, on_message, 0, []

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            if self.on_message is not None:
                self.on_message(self.delivered + 1, msg)
            out.extend(super().send_and_receive([msg], timeout=timeout))
            self.delivered += 1
            self.types.append(msg.metadata.message_type)
            if self.crash_after is not None and self.delivered >= self.crash_after:
                raise Crash(f"after message {self.delivered}")
        return out


@pytest.fixture(autouse=True)
def counted_noise(monkeypatch, tmp_path):
    """Each party's draws take the next seed of its own counter: the same draws in the same order
    give the same noise, and a second draw of a release changes every later number."""
    counters = {}

    def rng(self, round, kind="train"):
        n = next(counters.setdefault(self.party_id, itertools.count()))
        return np.random.default_rng(np.random.SeedSequence([int(self.party_id), n]))
    monkeypatch.setattr(mech.GaussianOutputMechanism, "rng", rng)
    monkeypatch.setenv("FLOWER_VFL_STATE_DIR", str(tmp_path / "default-state"))
    store_mod.OPEN_STORES.clear()
    yield counters
    store_mod.OPEN_STORES.clear()


def ledger(nc, rc):
    src = declared_source(nc, rc, nc["partition-id"])
    return [(e.run, e.round, e.kind, e.noise_multiplier) for e in party_store(nc["state-dir"]).entries(src.key)]


def spent(nc, rc):
    from flower_vfl.privacy.accounting import epsilon_for_events
    src = declared_source(nc, rc, nc["partition-id"])
    events = [(e.mechanism, e.noise_multiplier) for e in party_store(nc["state-dir"]).entries(src.key)]
    return epsilon_for_events(events, DELTA, "exact")


def same_model(a, b):
    assert np.max(np.abs(np.asarray(a.decision_test_) - np.asarray(b.decision_test_))) <= 1e-9
    assert a.final_["test_accuracy"] == pytest.approx(b.final_["test_accuracy"], abs=1e-12)


# ------------------------------------------------------------------ ADMM, party 1 private
ADMM_RC = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 4, "party-wait": 0.0, "lam": 1e-2}


def admm_nodes(folder, eps=4.0, **kw):
    return {100: {"partition-id": 0, "state-dir": str(folder / "party0")},
            101: {"partition-id": 1, "state-dir": str(folder / "party1"), "dp": True, "dp-epsilon": eps,
                  "dp-delta": DELTA, "dp-train-rounds": 2, "dp-eval-rounds": 1, "dp-lam": 1e-2, **kw}}


def admm_run(ncs, rc, run_id, crash_after=None, on_message=None):
    st = sa.make_strategy(rc)
    grid = CrashGrid(ADMM_HANDLERS, ncs, rc, run_id, crash_after, on_message)
    st.start(grid)
    return st, grid


@pytest.fixture
def admm_clean(tmp_path, counted_noise):
    ncs = admm_nodes(tmp_path / "clean")
    rc = {**ADMM_RC, "state-dir": str(tmp_path / "clean" / "server")}
    st, grid = admm_run(ncs, rc, run_id=1)
    counted_noise.clear()                     # every crashed run starts from the same noise counters
    return st, ledger(ncs[101], rc), spent(ncs[101], rc), len(grid.types), grid.types


def test_admm_uninterrupted_run_makes_its_plan_exactly(admm_clean):
    st, entries, eps, n_messages, types = admm_clean
    assert [(r, k) for _, r, k, _ in entries] == [(5, "train"), (6, "train"), (6, "eval")]
    assert {run for run, *_ in entries} == {"1"}
    assert eps == pytest.approx(4.0, rel=1e-9)              # the plan spends the budget exactly
    assert types.count("query.identify") == 2 and types.count("evaluate") == 3


def test_admm_crash_after_every_message_then_resume_gives_the_same_model_and_ledger(tmp_path, admm_clean,
                                                                                   counted_noise):
    clean, entries, eps, n_messages, _ = admm_clean
    for k in range(1, n_messages):
        counted_noise.clear()
        folder = tmp_path / f"crash{k}"
        ncs = admm_nodes(folder)
        server = folder / "server"
        rc = {**ADMM_RC, "state-dir": str(server)}
        with pytest.raises(Crash):
            admm_run(ncs, rc, run_id=1, crash_after=k)
        if (server / "checkpoint.npz").exists():
            st, _ = admm_run(ncs, {**rc, "resume": str(server)}, run_id=2)
        else:                                   # died before it learnt the plan: nothing to resume
            assert k <= 2
            if k == 2:                          # the party admitted run 1 and holds its reservation
                with pytest.raises(ReplyError) as err:
                    admm_run(ncs, rc, run_id=2)
                assert str(err.value) == (
                    "party 1 (node 101) refused: party 1 refuses run 2: its budget is reserved by run 1 (0 of 3 "
                    "planned releases made). With that reservation ε=4 of its budget ε=4 is taken (δ=1e-05, "
                    "method='exact'; spent ε=0), and this run's plan of 3 release(s) would bring it to ε=5.992. "
                    "Wait for that run to end, or resume it (resume='<its state-dir>'); a reservation whose run "
                    "made no release (nor a first resume since) for dp-plan-expiry=86400 s (the party's node config) lapses")
                _lapse(ncs[101], rc)            # the party's own clock: a day later
            st, _ = admm_run(ncs, rc, run_id=3)
        same_model(st, clean)
        got = ledger(ncs[101], rc)
        assert [e[1:] for e in got] == [e[1:] for e in entries], k          # the same releases, no second
        assert spent(ncs[101], rc) == eps, k                               # the same exact epsilon


def _lapse(nc, rc):
    """Move the party's plans a day and a second into the past (its clock, its disk)."""
    src = declared_source(nc, rc, nc["partition-id"])
    db = party_store(nc["state-dir"])._db
    db.execute("UPDATE plans SET updated = updated - 86401 WHERE source=?", (src.key,))


def test_two_runs_at_once_the_second_is_refused_before_any_round_naming_the_first(tmp_path, admm_clean,
                                                                                counted_noise):
    clean, entries, eps, _, _ = admm_clean
    ncs = admm_nodes(tmp_path / "two")
    rc = {**ADMM_RC, "state-dir": str(tmp_path / "two" / "server-a")}
    rc_b = {**ADMM_RC, "state-dir": str(tmp_path / "two" / "server-b")}
    second = {}

    def start_b(i, msg):        # run 2 starts while run 1 is in its 6th message (private rounds ahead)
        if i == 6 and not second:
            grid_b = CrashGrid(ADMM_HANDLERS, ncs, rc_b, 2)
            with pytest.raises(ReplyError) as err:
                sa.make_strategy(rc_b).start(grid_b)
            second["error"], second["types"] = str(err.value), grid_b.types
    st, _ = admm_run(ncs, rc, run_id=1, on_message=start_b)
    assert second["error"] == (
        "party 1 (node 101) refused: party 1 refuses run 2: its budget is reserved by run 1 (0 of 3 planned "
        "releases made). With that reservation ε=4 of its budget ε=4 is taken (δ=1e-05, method='exact'; spent "
        "ε=0), and this run's plan of 3 release(s) would bring it to ε=5.992. Wait for that run to end, or "
        "resume it (resume='<its state-dir>'); a reservation whose run made no release (nor a first resume since) for "
        "dp-plan-expiry=86400 s (the party's node config) lapses")
    assert second["types"] == ["query.identify", "query.identify"]          # before any round
    same_model(st, clean)                                                   # run 1 is untouched
    assert ledger(ncs[101], rc) == entries and spent(ncs[101], rc) == eps
    # once run 1's model is out its plan is closed: what is left is all there is (nothing)
    with pytest.raises(ReplyError, match=r"^party 1 \(node 101\) is private and its remaining budget cannot cover "
                                         r"its plan: it has spent epsilon=4 of 4 on this data"):
        admm_run(ncs, rc_b, run_id=3)


def test_a_resume_continues_its_plan_without_a_new_check_even_when_nothing_is_left(tmp_path, admm_clean,
                                                                                   counted_noise):
    """Crash after the model release: the budget is spent, the resume continues the plan and gets the
    stored model (a new plan would be refused: the issue's 'ε 47.17 of 50 spent, model lost')."""
    clean, entries, eps, n_messages, types = admm_clean
    ncs = admm_nodes(tmp_path / "late")
    server = tmp_path / "late" / "server"
    rc = {**ADMM_RC, "state-dir": str(server)}
    last_eval = max(i for i, t in enumerate(types, 1) if t == "evaluate")
    with pytest.raises(Crash):
        admm_run(ncs, rc, run_id=1, crash_after=last_eval)
    assert spent(ncs[101], rc) == eps                      # everything spent, no model on the server
    st, grid = admm_run(ncs, {**rc, "resume": str(server)}, run_id=2)
    same_model(st, clean)
    assert ledger(ncs[101], rc) == entries


def test_a_full_disk_at_a_release_then_resume_continues_the_plan(tmp_path, admm_clean, counted_noise, monkeypatch):
    clean, entries, eps, _, _ = admm_clean
    ncs = admm_nodes(tmp_path / "disk")
    server = tmp_path / "disk" / "server"
    rc = {**ADMM_RC, "state-dir": str(server)}
    real = store_mod.PartyStore._commit_release
    calls = []

    def full(self, *a, **kw):              # the party's second release meets a full disk
        calls.append(a[3])
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, *a, **kw)
    monkeypatch.setattr(store_mod.PartyStore, "_commit_release", full)
    from flower_vfl.strategies.exchange import PartyFailed
    with pytest.raises(PartyFailed, match=r"StoreDiskError: cannot charge a release in the party's ledger .*: No "
                                          r"space left on device\. Set the node-config key state-dir"):
        admm_run(ncs, rc, run_id=1)
    assert [e[1:3] for e in ledger(ncs[101], rc)] == [(5, "train")]         # the failed write charged nothing
    monkeypatch.setattr(store_mod.PartyStore, "_commit_release", real)      # space freed
    # the failed attempt drew noise 1 and lost it with the write (never sent, never charged): the
    # uninterrupted run's draw 1 is used again, so the resumed run must end exactly where it did
    counted_noise[1] = itertools.count(1)
    st, _ = admm_run(ncs, {**rc, "resume": str(server)}, run_id=2)
    got = ledger(ncs[101], rc)
    assert [e[1:] for e in got] == [e[1:] for e in entries] and spent(ncs[101], rc) == eps
    assert {e[0] for e in got} == {"1"}                                     # one plan: run 1's
    same_model(st, clean)


# ------------------------------------------------------------------ secure aggregation, every party private
SECAGG_HANDLERS = {**ADMM_HANDLERS, "query.secagg_keys": ca.secagg_keys}
SECAGG_RC = {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 3, "secagg": True, "lam": 1e-3,
             "acceleration": "none", "party-wait": 0.0}


def secagg_nodes(folder):
    return {100 + i: {"partition-id": i, "dp": True, "dp-epsilon": 2.0, "dp-train-rounds": 2, "dp-eval-rounds": 1,
                      "state-dir": str(folder / f"p{i}")} for i in range(2)}


def secagg_run(ncs, rc, run_id, crash_after=None):
    st = sa.make_strategy(rc)
    grid = CrashGrid(SECAGG_HANDLERS, ncs, rc, run_id, crash_after)
    st.start(grid)
    return st, grid


def test_secagg_all_private_crash_after_every_message_then_resume_gives_the_same_model_and_ledger(tmp_path,
                                                                                                counted_noise):
    """Under secure aggregation the central node sees only sums, but a run whose parties are all private
    resumes: each party continues its plan from its own state-dir (its iterate, its stored releases,
    masked again under the new run's keys: the same sum). A crash before the round-0 checkpoint (in
    identify) leaves the reservations to lapse, then a re-run."""
    ncs = secagg_nodes(tmp_path / "clean")
    rc = {**SECAGG_RC, "state-dir": str(tmp_path / "clean" / "server")}
    clean, grid = secagg_run(ncs, rc, run_id=1)
    entries = {nid: ledger(nc, rc) for nid, nc in ncs.items()}
    assert [(r, k) for _, r, k, _ in entries[100]] == [(4, "train"), (5, "train"), (5, "eval")]
    for k in range(1, len(grid.types)):
        counted_noise.clear()
        folder = tmp_path / f"crash{k}"
        ncs = secagg_nodes(folder)
        server = folder / "server"
        rc = {**SECAGG_RC, "state-dir": str(server)}
        with pytest.raises(Crash):
            secagg_run(ncs, rc, run_id=1, crash_after=k)
        if (server / "checkpoint.npz").exists():
            st, _ = secagg_run(ncs, {**rc, "resume": str(server)}, run_id=2)
        else:
            assert grid.types[k - 1] == "query.identify"
            for nc in ncs.values():
                _lapse(nc, rc)
            st, _ = secagg_run(ncs, rc, run_id=2)
        same_model(st, clean)
        for nid, nc in ncs.items():
            assert [e[1:] for e in ledger(nc, rc)] == [e[1:] for e in entries[nid]], (k, nid)


# ------------------------------------------------------------------ the one-release routes: crash, re-run
def one_release_nodes(folder, pool=True, eps=20.0):
    out = {}
    for m in range(2):
        nc = {"partition-id": m, "state-dir": str(folder / f"party{m}"), "dp": True, "dp-epsilon": eps,
              "dp-delta": DELTA, "dp-clip": 1.5}
        if pool:
            nc["moment-pool"] = "test"
        out[100 + m] = nc
    return out


ROUTES = {
    "moment": (MOMENT_HANDLERS, {"dataset": "breast_cancer", "num-parties": 2, "route": "moment", "party-wait": 0.0,
                                 "lam": 3e-4, "max-rounds": 4}, True),
    "stacked-ssp": (SSP_HANDLERS, {"dataset": "breast_cancer", "num-parties": 2, "route": "stacked-ssp",
                                   "party-wait": 0.0}, False),
}


def one_release_run(route, ncs, run_id, crash_after=None):
    handlers, rc, _ = ROUTES[route]
    st = sa.make_strategy(rc)
    grid = CrashGrid(handlers, ncs, rc, run_id, crash_after)
    st.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=1, timeout=120)
    return st, grid


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_one_release_route_crash_after_every_message_then_re_run_gives_the_same_model_and_ledger(
        route, tmp_path, counted_noise):
    _, rc, pool = ROUTES[route]
    ncs = one_release_nodes(tmp_path / "clean", pool)
    clean, grid = one_release_run(route, ncs, run_id=1)
    entries = {m: ledger(nc, rc) for m, nc in ncs.items()}
    assert all([(r, k) for _, r, k, _ in e] == [(1, "eval")] for e in entries.values())
    n = len(grid.types)
    crash_at = sorted(set(range(1, min(n, 7))) | {n // 2, n - 1})     # identify, release, rounds, evaluation
    for k in crash_at:
        counted_noise.clear()
        ncs = one_release_nodes(tmp_path / f"crash{k}", pool)
        with pytest.raises(Crash):
            one_release_run(route, ncs, run_id=1, crash_after=k)
        st, _ = one_release_run(route, ncs, run_id=2)                      # a new run: same targets
        same_model(st, clean)
        for m, nc in ncs.items():
            got = ledger(nc, rc)
            assert [e[1:] for e in got] == [e[1:] for e in entries[m]], (k, m)   # one release, one charge
            assert math.isclose(spent(nc, rc), spent(ncs[m], rc))


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_re_run_asking_another_release_is_charged_and_refused_past_the_budget(route, tmp_path):
    handlers, rc, pool = ROUTES[route]
    ncs = one_release_nodes(tmp_path, pool)
    first, _ = one_release_run(route, ncs, run_id=1)
    # the same release again in runs 2 and 3: served from the store, charged once
    again, _ = one_release_run(route, ncs, run_id=2)
    same_model(again, first)
    assert all(len(ledger(nc, rc)) == 1 for nc in ncs.values())
    # another target (another clip in the node config means another release): refused, nothing charged
    other = {nid: {**nc, "dp-clip": 1.0} for nid, nc in ncs.items()}
    from flower_vfl.strategies.exchange import PartyRefused
    with pytest.raises(PartyRefused, match=r"^party 0 refused: party 0 refuses the eval release for round 1 "
                                           r"\(noise multiplier z=[0-9.]+\): it would bring the total to ε=[0-9.]+, "
                                           r"above the budget ε=20"):
        one_release_run(route, other, run_id=3)
    assert all(len(ledger(nc, rc)) == 1 for nc in ncs.values())


# ------------------------------------------------------------------ the party's own lapse, and who sets it
def test_dp_plan_expiry_is_the_party_nodes_and_a_lapsed_reservation_lets_a_new_plan_in(tmp_path, admm_clean,
                                                                                      counted_noise):
    """A run that identified and died before any release: with the node config's dp-plan-expiry=0
    its reservation lapses at once and a re-run is admitted (the same model and ledger); the run
    config cannot set the key."""
    from flower_vfl.config.schema import ConfigError
    clean, entries, eps, _, _ = admm_clean
    ncs = admm_nodes(tmp_path / "expiry", **{"dp-plan-expiry": 0.0})
    rc = {**ADMM_RC, "state-dir": str(tmp_path / "expiry" / "server")}
    with pytest.raises(Crash):
        admm_run(ncs, rc, run_id=1, crash_after=2)            # both identified, the server never learnt it
    st, _ = admm_run(ncs, rc, run_id=2)
    same_model(st, clean)
    assert [e[1:] for e in ledger(ncs[101], rc)] == [e[1:] for e in entries] and spent(ncs[101], rc) == eps
    with pytest.raises(ConfigError) as err:
        sa.make_strategy({**ADMM_RC, "dp-plan-expiry": 0.0})
    assert str(err.value) == (
        "run config key 'dp-plan-expiry' can only be set in a SuperNode's node config (--node-config "
        "\"dp-plan-expiry=...\"): a private party: seconds without a release (nor a first resume since) after which a run's reserved "
        "plan lapses (a run that died and is never resumed does not hold the budget forever; docs/privacy.md)")


# ------------------------------------------------------------------ secure aggregation, non-private parties
PUBLIC_SECAGG_RC = {"dataset": "breast_cancer", "num-parties": 3, "max-rounds": 4, "secagg": True, "lam": 1e-3,
                    "acceleration": "none", "party-wait": 0.0}


def public_secagg_nodes(folder):
    return {100 + i: {"partition-id": i, "state-dir": str(folder / f"p{i}")} for i in range(3)}


def test_secagg_non_private_crash_after_every_message_then_resume_gives_the_same_model(tmp_path):
    """Under secure aggregation the central node never sees a non-private party's release, so it
    cannot re-synchronize it; each party keeps its own state after every masked training answer on
    its own disk, under its run's resume token (checkpointed by the central node), and a resumed run
    finds it there. A crash after every message of the run (identify, key adverts, every round,
    every evaluation), then a resume (or, before the round-0 checkpoint, a new run): the model of the
    uninterrupted run, to 1e-9, and the parties answer sums over their one roster throughout."""
    ncs = public_secagg_nodes(tmp_path / "clean")
    rc = {**PUBLIC_SECAGG_RC, "state-dir": str(tmp_path / "clean" / "server")}
    clean, grid = secagg_run(ncs, rc, run_id=1)
    assert {"query.secagg_keys", "train", "evaluate"} <= set(grid.types)
    resumed = 0
    for k in range(1, len(grid.types)):
        folder = tmp_path / f"crash{k}"
        ncs = public_secagg_nodes(folder)
        server = folder / "server"
        rc = {**PUBLIC_SECAGG_RC, "state-dir": str(server)}
        with pytest.raises(Crash):
            secagg_run(ncs, rc, run_id=1, crash_after=k)
        if (server / "checkpoint.npz").exists():
            st, again = secagg_run(ncs, {**rc, "resume": str(server)}, run_id=2)
            resumed += 1
        else:
            assert grid.types[k - 1] == "query.identify"
            st, again = secagg_run(ncs, rc, run_id=2)
        same_model(st, clean)
        assert len(st.history_) == len(clean.history_), k
    assert resumed >= len(grid.types) - 4


def test_secagg_non_private_resume_over_another_roster_is_refused_by_the_parties(tmp_path, monkeypatch):
    """The resume token restores a party's state, never its roster: a resumed run whose central node
    sums over fewer parties is refused by each party (its disk's one roster), exact message."""
    ncs = public_secagg_nodes(tmp_path)
    server = tmp_path / "server"
    rc = {**PUBLIC_SECAGG_RC, "state-dir": str(server)}
    with pytest.raises(Crash):
        secagg_run(ncs, rc, run_id=1, crash_after=8)
    from flower_vfl.strategies.secagg_central import CentralSecAgg
    real = CentralSecAgg.fields
    monkeypatch.setattr(CentralSecAgg, "fields", lambda self, parties: real(self, [p for p in parties if p != 2]))
    from flower_vfl.strategies.exchange import PartyRefused
    with pytest.raises(PartyRefused) as err:
        secagg_run(ncs, {**rc, "resume": str(server)}, run_id=2)
    assert str(err.value) == (
        "party 0 refused: party 'party0' answers secure sums over one roster only, [party0,party1,party2] (recorded "
        "in its state folder at its first masked answer); refused in a sum over [party0,party1]: the central node "
        "could subtract two sums over different parties and read the releases of the parties in one and not the "
        "other. Run with the same parties, or pin the parties' keys (secagg-pins: every pinned party is then "
        "required); a new roster for this party's data is its operator's decision only (a new secagg-name, pinned "
        "by the others), knowing the central node can then difference the two rosters' sums (docs/secagg.md)")


def test_secagg_non_private_resume_without_the_parties_state_is_refused_naming_them(tmp_path):
    ncs = public_secagg_nodes(tmp_path)
    server = tmp_path / "server"
    rc = {**PUBLIC_SECAGG_RC, "state-dir": str(server)}
    with pytest.raises(Crash):
        secagg_run(ncs, rc, run_id=1, crash_after=12)
    from flower_vfl.strategies.checkpointing import ResumeRefused
    moved = {**ncs, 102: {**ncs[102], "state-dir": str(tmp_path / "elsewhere")}}
    with pytest.raises(ResumeRefused) as err:
        secagg_run(moved, {**rc, "resume": str(server)}, run_id=2)
    assert str(err.value) == (
        f"resume={str(server)!r} with secagg=true: non-private parties [2] hold no state of round 1 under the "
        "checkpoint's resume token (their state-dir, partition-id or secagg-name is not the run's, or the run kept "
        "no token): re-synchronizing them needs their own last release, which the central node never saw under "
        "secure aggregation. Resume with the parties' original node configs and state-dirs, or start a new run "
        "without resume")


def test_a_restarted_non_private_party_under_secagg_rejoins_from_its_own_disk(tmp_path, caplog):
    """Under secure aggregation the central node holds no party's release, so it cannot re-synchronize
    a restarted non-private party: party 1's node goes away after answering round 3 (its reply lost)
    and comes back without its state; identified again with its run's resume token and the last
    round summed (2), it restores its state of round 2 from its state-dir, every party is re-keyed and
    round 3 is sent again (party 1 computes it again: the same value, which its sums record accepts).
    The model of the uninterrupted run. A node that comes back without that state on its disk is
    refused naming the fix, and the run then resumes from its checkpoint."""
    from flower_vfl.strategies.checkpointing import ResumeRefused
    from tests.test_secagg_flower import DropGrid, run

    class NoState(DropGrid):
        keep_state = False
    clean, _ = run(True, nodes={100 + i: {"partition-id": i, "state-dir": str(tmp_path / f"c{i}")} for i in range(3)},
                   **{"state-dir": str(tmp_path / "clean")})
    nodes = {100 + i: {"partition-id": i, "state-dir": str(tmp_path / f"p{i}")} for i in range(3)}
    st, grid = run(True, nodes=nodes, grid_cls=NoState, **{"state-dir": str(tmp_path / "server")})
    assert st.node_to_party[201] == 1 and st.secagg.key_agreements == 2        # re-keyed once
    same_model(st, clean)

    class Elsewhere(NoState):      # the new node's node config names another state-dir
        def send_and_receive(self, messages, *, timeout=None):
            out = super().send_and_receive(messages, timeout=timeout)
            if 201 in self.contexts and self.contexts[201].node_config["state-dir"] != str(tmp_path / "other"):
                self.contexts[201].node_config["state-dir"] = str(tmp_path / "other")
            return out
    nodes = {100 + i: {"partition-id": i, "state-dir": str(tmp_path / f"q{i}")} for i in range(3)}
    with pytest.raises(ResumeRefused) as err:
        run(True, nodes=nodes, grid_cls=Elsewhere, **{"state-dir": str(tmp_path / "server2")})
    assert str(err.value) == (
        "party 1 came back without its state (a restarted SuperNode) and secagg=true, and its state-dir holds no "
        "state of round 2 under the run's resume token (another state-dir, partition-id or secagg-name): "
        "re-synchronizing it needs its own last release s_m, which the central node does not hold under secure "
        "aggregation. Restart it with its node config and state-dir, and resume the run (resume='<state-dir>')")
    assert f"(checkpoint: {tmp_path / 'server2'})" in caplog.text
    st, _ = run(True, nodes=nodes, **{"state-dir": str(tmp_path / "server2"), "resume": str(tmp_path / "server2")})
    same_model(st, clean)
