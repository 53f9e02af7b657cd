"""A party's value enters secure sums over one roster, ever (docs/secagg.md, "What a malicious
central node learns"): through the real ClientApp handlers with a fresh Context per run, a central
node that sums a party's values over two sets of parties (across rounds, across kinds, across
runs), adds a party of its own (a sybil), drops a party or replays adverts is refused with the
exact message, or learns only what the threat table says; the honest sums are the plain sums to
the fixed-point bound M/(2 scale) per entry, and an honest second run gives the very same sums.

Settings: pinned keys (every pinned party required: the default), pinned keys with the explicit
weakening ``secagg-require-all=false``, no pins (a simulation, or a deployed SuperNode whose node
config says ``secagg-trust='honest-but-curious'``; without it a deployed party refuses)."""

import sys

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.apps.server import make_strategy
from flower_vfl.config.schema import ConfigError
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io.data import party_block
from flower_vfl.secagg import (Advert, FixedPoint, KeyAgreement, MaskContext, Roster, Session, TrustRefused,
                               broadcast_digest, public_key_hex, secure_sum, signing_key_pem, unmask_sum)
from flower_vfl.secagg.masking import ADVERTS, PARTIES
from flower_vfl.strategies.exchange import PartyFailed
from flower_vfl.strategies.vertical_admm import PartyRefused

M = 3
ALL = ["party0", "party1", "party2"]
N = party_block("breast_cancer", 0, M)[0].shape[0]
#: each round's decoded sum against the exact sum of the plain releases (default secagg-bound 1e4)
BOUND = FixedPoint([1e4] * M).error_bound
H = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify,
     "query.secagg_keys": ca.secagg_keys}


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity
    for attr, value in (("_run_id", 1), ("_task_id", 0), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def rc(secagg=True, m=M, **kw):
    return {"dataset": "breast_cancer", "num-parties": m, "max-rounds": 6, "secagg": secagg, "lam": 1e-3,
            "acceleration": "none", "variant": "sharing-fixed", "party-wait": 5.0, **kw}


def settings(tmp_path, setting):
    """Each party's node config: 'pinned' (keys pinned, every pinned party required by default),
    'weakened' (pinned, secagg-require-all=false), 'unpinned'. Each party has its own state-dir."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = {i: {"partition-id": i, "state-dir": str(tmp_path / f"p{i}")} for i in range(M)}
    if setting == "unpinned":
        return out
    keys = [Ed25519PrivateKey.generate() for _ in range(M)]
    for i, k in enumerate(keys):
        (tmp_path / f"party{i}.pem").write_bytes(signing_key_pem(k))
        out[i].update({"secagg-signing-key": str(tmp_path / f"party{i}.pem"),
                       "secagg-pins": ", ".join(f"party{j}={public_key_hex(keys[j])}" for j in range(M) if j != i)})
        if setting == "weakened":
            out[i]["secagg-require-all"] = False
    return out


def contexts(nodes, run_id):
    """A fresh Context per party: a new run (Flower gives each run its own)."""
    return [Context(run_id=run_id, node_id=100 + i, node_config=dict(nodes[i]), state=RecordDict(),
                    run_config=rc()) for i in sorted(nodes)]


def adverts(ctxs):
    return [ca.secagg_keys(Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=c.node_id,
                                   message_type="query.secagg_keys"), c).content["secagg"]["advert"] for c in ctxs]


def train_msg(c, ads, names, q, y, rnd=1):
    rd = RecordDict({"vectors": ArrayRecord({"q": Array(np.asarray(q)), "y": Array(np.asarray(y))}),
                     "config": ConfigRecord({"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 1 / M,
                                             **({} if ads is None else {ADVERTS: list(ads), PARTIES: list(names)})})})
    return Message(rd, dst_node_id=c.node_id, message_type="train")


def eval_msg(c, ads, names, rnd):
    cfg = {"round": rnd, "rho": 1e-2, "alpha": 1.0, "theta": 1 / M, "n_outputs": 1}
    if ads is not None:
        cfg.update({ADVERTS: list(ads), PARTIES: list(names)})
    return Message(RecordDict({"config": ConfigRecord(cfg)}), dst_node_id=c.node_id, message_type="evaluate")


def inputs():
    rng = np.random.default_rng(7)
    return rng.normal(size=N) * 0.1, rng.normal(size=N) * 1e-3


def answer(handler, msg, c):
    rep = handler(msg, c).content
    if "refusal" in rep:
        return rep["refusal"]
    key = "s" if "s" in rep["release"] else "s_test"
    return rep["release"][key].numpy()


def decode(masked: dict, ads, names):
    roster = Roster([a for a in map(Advert.from_bytes, ads) if a.name in names])
    return secure_sum(masked, roster)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The parties' plain releases of round 1 (train) and their held-out scores after it, from
    fresh Contexts (secagg off: nothing recorded): the references of the decoded sums."""
    nodes = {i: {"partition-id": i, "state-dir": str(tmp_path_factory.mktemp("plain") / f"p{i}")} for i in range(M)}
    from flwr.supercore.task_identity import TaskIdentity
    old = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = 1, 0, 0
    try:
        ctxs = contexts(nodes, 900)
        q, y = inputs()
        s = [answer(ca.train, train_msg(c, None, None, q, y), c) for c in ctxs]
        s_test = [answer(ca.evaluate, eval_msg(c, None, None, 1), c) for c in ctxs]
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = old
    return s, s_test


def close_to(got, parts):
    exact = sum(parts)
    slack = 4 * np.finfo(float).eps * max(float(np.max(np.abs(exact))), 1.0)
    assert np.max(np.abs(got - exact)) <= BOUND + slack


def refusal_of(rep):
    assert not isinstance(rep, np.ndarray), "answered: expected a refusal"
    return rep["code"], rep["reason"]


def roster_refusal(name, recorded, asked, pinned):
    """``pinned``: True pinned with secagg-require-all=false (the weakening), False unpinned, None
    pinned with every pinned party required (its pins changed)."""
    hint = ("" if pinned is None else
            ", or drop the weakening secagg-require-all=false (every pinned party is then required)" if pinned else
            ", or pin the parties' keys (secagg-pins: every pinned party is then required)")
    return (f"party {name!r} answers secure sums over one roster only, [{','.join(recorded)}] (recorded in its "
            f"state folder at its first masked answer); refused in a sum over [{','.join(asked)}]: the central node "
            "could subtract two sums over different parties and read the releases of the parties in one and not "
            f"the other. Run with the same parties{hint}; a new roster for this party's data is its operator's "
            "decision only (a new secagg-name, pinned by the others), knowing the central node can then difference "
            "the two rosters' sums (docs/secagg.md)")


def lacks_refusal(name, absent, where="the parties summed lack {}, which this party requires"):
    return (f"party {name!r}: " + where.format(absent) + " (every party pinned in its node config, secagg-pins, "
            "unless secagg-require-all=false, a weakening; and secagg-require); refused")


# ------------------------------------------------ across rounds of one run (issue table, row 1)
@pytest.mark.parametrize("setting", ["pinned", "weakened", "unpinned"])
def test_evaluate_rounds_over_two_rosters_are_refused_in_every_setting(tmp_path, plain, setting):
    """Round 1 over {p0, p1, p2}, then evaluate round 1 over all three and round 2 over {p0, p1}:
    the difference of the two evaluation sums would be p2's exact held-out scores. Pinned (the
    default): p0 and p1 require every pinned party; weakened or unpinned: their disk holds the
    roster of their first answer. The sums the parties did answer are the plain sums."""
    nodes = settings(tmp_path, setting)
    ctxs = contexts(nodes, 1)
    ads = adverts(ctxs)
    q, y = inputs()
    s = {n: answer(ca.train, train_msg(c, ads, ALL, q, y), c) for n, c in zip(ALL, ctxs)}
    close_to(decode(s, ads, ALL), plain[0])
    s_test = {n: answer(ca.evaluate, eval_msg(c, ads, ALL, 1), c) for n, c in zip(ALL, ctxs)}
    close_to(decode(s_test, ads, ALL), plain[1])
    for name, c in zip(ALL[:2], ctxs[:2]):
        code, reason = refusal_of(answer(ca.evaluate, eval_msg(c, ads, ALL[:2], 2), c))
        if setting == "pinned":
            assert (code, reason) == ("secagg-key", lacks_refusal(name, ["party2"]))
        else:
            assert (code, reason) == ("secagg-roster", roster_refusal(name, ALL, ALL[:2], setting == "weakened"))


# ------------------------------------------------ across kinds (train vs evaluate)
def test_train_and_evaluate_over_two_rosters_are_refused(tmp_path):
    """Training over {p0, p1, p2}; evaluation of the same model over {p0, p1}: refused (weakened
    setting: the disk's roster; the pinned default refuses it by the required names)."""
    nodes = settings(tmp_path, "weakened")
    ctxs = contexts(nodes, 1)
    ads = adverts(ctxs)
    q, y = inputs()
    for c in ctxs:
        assert isinstance(answer(ca.train, train_msg(c, ads, ALL, q, y), c), np.ndarray)
    assert refusal_of(answer(ca.evaluate, eval_msg(ctxs[0], ads, ALL[:2], 1), ctxs[0])) == \
        ("secagg-roster", roster_refusal("party0", ALL, ALL[:2], True))
    assert refusal_of(answer(ca.evaluate, eval_msg(ctxs[2], ads, ALL[1:], 1), ctxs[2])) == \
        ("secagg-roster", roster_refusal("party2", ALL, ALL[1:], True))


# ------------------------------------------------ across runs (issue table, row 2)
@pytest.mark.parametrize("setting", ["pinned", "weakened", "unpinned"])
def test_the_same_round_in_a_new_run_over_another_roster_is_refused(tmp_path, plain, setting):
    """Run 1 sums round 1 (q, y) over {p0, p1, p2}; run 2 (fresh Contexts, the same SuperNodes'
    disks) asks the same round 1 (q, y) over {p0, p1}: the difference would be p2's exact release
    D_2 x_2. Refused by p0 and p1. Run 3 over the same three parties gets the very same sum
    (bitwise: the server learns nothing it did not know)."""
    nodes = settings(tmp_path, setting)
    q, y = inputs()
    ctxs = contexts(nodes, 1)
    ads = adverts(ctxs)
    first = decode({n: answer(ca.train, train_msg(c, ads, ALL, q, y), c) for n, c in zip(ALL, ctxs)}, ads, ALL)
    close_to(first, plain[0])
    ctxs = contexts(nodes, 2)
    ads = adverts(ctxs[:2])                                  # p2 is left out of run 2 altogether
    for name, c in zip(ALL[:2], ctxs[:2]):
        code, reason = refusal_of(answer(ca.train, train_msg(c, ads, ALL[:2], q, y), c))
        if setting == "pinned":
            assert (code, reason) == ("secagg-key", lacks_refusal(
                name, ["party2"], where="the roster lacks parties {} that this party requires"))
        else:
            assert (code, reason) == ("secagg-roster", roster_refusal(name, ALL, ALL[:2], setting == "weakened"))
    ctxs = contexts(nodes, 3)
    ads = adverts(ctxs)
    again = decode({n: answer(ca.train, train_msg(c, ads, ALL, q, y), c) for n, c in zip(ALL, ctxs)}, ads, ALL)
    np.testing.assert_array_equal(again, first)


# ------------------------------------------------ no pins (issue table, row 3) and sybils
def deployed(monkeypatch):
    """Make the party's process look like a deployed SuperNode's ClientApp (flwr-clientapp)."""
    monkeypatch.setattr(sys, "argv", ["flwr-clientapp"])


TRUST = ("party 'party0': secagg=true on a deployed SuperNode without secagg-pins: the central node could relay "
         "its own key in another party's name (a sybil) and read this party's release. Pin the other parties' "
         "Ed25519 keys (node config secagg-signing-key and secagg-pins), or accept an honest-but-curious central "
         "node explicitly (node config secagg-trust='honest-but-curious', docs/secagg.md); refused")


def test_a_deployed_party_without_pins_refuses_unless_it_accepts_an_honest_but_curious_server(tmp_path,
                                                                                               monkeypatch):
    deployed(monkeypatch)
    nodes = settings(tmp_path, "unpinned")
    [c] = contexts({0: nodes[0]}, 1)
    with pytest.raises(TrustRefused) as err:
        adverts([c])
    assert str(err.value) == TRUST and err.value.code == "secagg-trust"
    # a masked request is refused the same way (no advert was ever given, nothing recorded)
    q, y = inputs()
    assert refusal_of(answer(ca.train, train_msg(c, [b"x"], ["party0", "party1"], q, y), c)) == \
        ("secagg-trust", TRUST)
    # through the whole Flower path: the run stops at the key agreement, before any round
    with pytest.raises(PartyFailed, match=r"party 0 \(node 100\) failed in the secure-aggregation key advert "
                                          r"request \(Flower error 2\): TrustRefused: party 'party0': secagg=true on "
                                          "a deployed SuperNode without secagg-pins"):
        st = make_strategy(rc())
        st.start(grid=LocalGrid(H, {100 + i: nodes[i] for i in range(M)}, rc()), num_rounds=6, timeout=60)
    # the node config's explicit acceptance: the advert is given
    nodes[0]["secagg-trust"] = "honest-but-curious"
    [c] = contexts({0: nodes[0]}, 2)
    assert Advert.from_bytes(adverts([c])[0]).name == "party0"


def sybil_sum(victim_ctx, victim_ad, q, y, rnd=1):
    """The central node adds its own advert ('sybil') to a roster with the victim and unmasks the
    victim's answer with the pair seed it shares with it."""
    own = KeyAgreement("sybil", str(victim_ctx.run_id), 1e4)
    ads = [victim_ad, own.advert.to_bytes()]
    names = ["party0", "sybil"]
    rep = answer(ca.train, train_msg(victim_ctx, ads, names, q, y, rnd), victim_ctx)
    if not isinstance(rep, np.ndarray):
        return rep
    session = Session.establish(own, ads)
    cfg = train_msg(victim_ctx, ads, names, q, y, rnd).content
    digest = broadcast_digest({k: cfg["vectors"][k].numpy() for k in cfg["vectors"]},
                              {k: cfg["config"][k] for k in cfg["config"]})
    mine = session.mask(np.zeros(N, dtype=np.uint64), MaskContext(rnd, "train", digest))
    return session.roster.fixed_point.decode_sum(unmask_sum({"party0": rep, "sybil": mine}, session.roster))


def test_a_bad_trust_or_require_all_value_is_refused_naming_the_key(tmp_path):
    q, y = inputs()
    for key, value, says in (("secagg-trust", "trusting", "node config key 'secagg-trust'='trusting' is not "
                              "allowed: expected one of 'malicious', 'honest-but-curious'"),
                             ("secagg-require-all", "maybe", "node config key 'secagg-require-all'='maybe': "
                              "expected true or false")):
        [c] = contexts({0: {"partition-id": 0, key: value}}, 1)
        with pytest.raises(ConfigError) as err:
            ca.train(train_msg(c, [b"x"], ALL, q, y), c)
        assert str(err.value).startswith(says)


def test_a_pinned_party_whose_pins_change_keeps_its_roster(tmp_path):
    """Run 1 with three pinned parties; then party0's operator pins party1 only (a federation of
    two, for the same data): the sum over {party0, party1} is refused by party0's disk (the
    difference with run 1's sums would be party2's release)."""
    nodes = settings(tmp_path, "pinned")
    q, y = inputs()
    ctxs = contexts(nodes, 1)
    ads = adverts(ctxs)
    for c in ctxs:
        assert isinstance(answer(ca.train, train_msg(c, ads, ALL, q, y), c), np.ndarray)
    nodes[0]["secagg-pins"] = nodes[0]["secagg-pins"].split(",")[0]
    nodes[1]["secagg-pins"] = nodes[1]["secagg-pins"].split(",")[0]
    ctxs = contexts({i: nodes[i] for i in range(2)}, 2)
    ads = adverts(ctxs)
    for name, c in zip(ALL[:2], ctxs):
        assert refusal_of(answer(ca.train, train_msg(c, ads, ALL[:2], q, y), c)) == (
            "secagg-roster", roster_refusal(name, ALL, ALL[:2], None))


def test_a_sybil_reads_the_release_of_an_unpinned_party_and_is_refused_with_pins(tmp_path, monkeypatch, plain):
    """Honest-but-curious accepted on a deployed node (or a simulation): a central node that adds
    its own advert reads party0's exact release (what the threat table says). Pinned: refused,
    naming the unpinned advert."""
    deployed(monkeypatch)
    q, y = inputs()
    nodes = settings(tmp_path / "hbc", "unpinned")
    nodes[0]["secagg-trust"] = "honest-but-curious"
    [c] = contexts({0: nodes[0]}, 1)
    read = sybil_sum(c, adverts([c])[0], q, y)
    assert np.max(np.abs(read - plain[0][0])) <= FixedPoint([1e4, 1e4]).error_bound + 1e-15
    for setting in ("pinned", "weakened"):
        nodes = settings(tmp_path / setting, setting)
        [c] = contexts({0: nodes[0]}, 1)
        assert refusal_of(sybil_sum(c, adverts([c])[0], q, y)) == (
            "secagg-key", "party 'party0': party 'sybil' has no pinned key in this party's node config (secagg-pins); "
                          "add its Ed25519 public key or leave it out of the run")


# ------------------------------------------------ replayed adverts, dropped parties
@pytest.mark.parametrize("setting", ["pinned", "unpinned"])
def test_replayed_adverts_of_another_run_are_refused(tmp_path, setting):
    nodes = settings(tmp_path, setting)
    q, y = inputs()
    old = adverts(contexts(nodes, 1))
    ctxs = contexts(nodes, 2)
    new = adverts(ctxs)
    # the whole old roster: this party's own advert is not in it
    assert refusal_of(answer(ca.train, train_msg(ctxs[0], old, ALL, q, y), ctxs[0])) == (
        "secagg-key", "party 'party0': the relayed roster does not contain this party's own advert unchanged; "
                      "refused (the central node altered or dropped it)")
    # its own new advert with the others' old ones
    assert refusal_of(answer(ca.train, train_msg(ctxs[0], new[:1] + old[1:], ALL, q, y), ctxs[0])) == (
        "secagg-key", "party 'party0': adverts of ['party1', 'party2'] are for another run than '2'; refused")


def test_a_dropped_party_means_no_sum_over_the_others(tmp_path):
    """p2 drops after round 1: a round over {p0, p1} is refused (pinned: p2 is required; weakened:
    the disk's roster); the central node alone cannot unmask a sum with a hole either."""
    q, y = inputs()
    for setting in ("pinned", "weakened"):
        nodes = settings(tmp_path / setting, setting)
        ctxs = contexts(nodes, 1)
        ads = adverts(ctxs)
        got = {n: answer(ca.train, train_msg(c, ads, ALL, q, y), c) for n, c in zip(ALL, ctxs)}
        with pytest.raises(Exception, match=r"no masked release from parties \['party2'\]"):
            secure_sum({k: got[k] for k in ALL[:2]}, Roster(list(map(Advert.from_bytes, ads))))
        code, reason = refusal_of(answer(ca.train, train_msg(ctxs[0], ads, ALL[:2], q, y, rnd=2), ctxs[0]))
        assert (code, reason) == (("secagg-key", lacks_refusal("party0", ["party2"])) if setting == "pinned" else
                                  ("secagg-roster", roster_refusal("party0", ALL, ALL[:2], True)))


# ------------------------------------------------ the Flower path: honest runs, a run of another roster
def test_honest_runs_give_the_same_model_and_a_run_over_fewer_parties_is_refused(tmp_path):
    """Two honest runs on the same disks (pinned keys with the weakening secagg-require-all=false,
    so that only the disk's roster stands in the way of the third) give the same model bitwise; a
    third run of the real strategy over 2 of the 3 parties is refused by party 0."""
    nodes = settings(tmp_path, "weakened")
    grid_nodes = {100 + i: nodes[i] for i in range(M)}
    models = []
    for run_id in (1, 2):
        st = make_strategy(rc())
        st.start(grid=LocalGrid(H, grid_nodes, rc(), run_id=run_id), num_rounds=6, timeout=60)
        models.append(st.decision_test_)
    np.testing.assert_array_equal(models[0], models[1])
    two = {100 + i: nodes[i] for i in range(2)}
    st = make_strategy(rc(m=2))
    with pytest.raises(PartyRefused, match="party 0 refused: " + "party 'party0' answers secure sums over one "
                                           r"roster only, \[party0,party1,party2\]"):
        st.start(grid=LocalGrid(H, two, rc(m=2), run_id=3), num_rounds=6, timeout=60)


def test_a_run_mixing_private_and_non_private_parties_is_refused_before_any_round(tmp_path):
    """The warm start sums the non-private parties alone, then every party: two rosters. Refused
    by the central node before any round (the parties would refuse the second)."""
    nodes = {100: {"partition-id": 0}, 101: {"partition-id": 1},
             102: {"partition-id": 2, "dp": True, "dp-epsilon": 2.0, "dp-train-rounds": 2, "dp-eval-rounds": 1,
                   "state-dir": str(tmp_path / "p2")}}
    sent = []
    grid = LocalGrid(H, nodes, rc(), on_reply=lambda msg, rep: sent.append(msg.metadata.message_type))
    with pytest.raises(ConfigError) as err:
        make_strategy(rc()).start(grid=grid, num_rounds=6, timeout=60)
    assert str(err.value) == (
        "secagg=true: this run sums parties [0, 1] alone in the warm start (private parties [2] sit it out) and "
        "parties [0, 1, 2] after it; a party's values go into secure sums over one set of parties only (the "
        "difference of two sums over different sets is the release of the parties in one and not the other, "
        "docs/secagg.md), so the parties would refuse. Run with every party private, no party private, or "
        "secagg=false")
    assert "train" not in sent and "query.secagg_keys" not in sent
