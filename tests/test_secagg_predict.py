"""Secure aggregation of the predict job (own data, mode=predict, run config secagg=true), through
the real handlers on a LocalGrid (a fresh Context per node and run): the label owner decodes only
the sum of the parties' scores, equal to the plain predict's scores within the fixed-point bound
M/(2 scale); one party's masked vector passes uniformity tests; a request that differs for one
party gives garbage that is refused, never a sum; a replay gets the stored masked answer; a lost
party means no scores (or its stored answer once it is back); without pins a central node that
relays its own key in another party's name reads the scores, with pins it is refused
(docs/secagg.md)."""

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from scipy import stats

from _own_data_helpers import HANDLERS, node_configs, run_config, run_train, write_a9a_files
from flower_vfl.apps import client as ca
from flower_vfl.deploy.local_grid import LocalGrid
from flower_vfl.io.data import load_all
from flower_vfl.secagg import (Advert, FixedPoint, KeyAgreement, KeyRefused, MaskContext, Roster, Session,
                               ReplayConflict, SumMismatch, broadcast_digest, public_key_hex, secure_sum, signing_key_pem,
                               unmask_sum)
from flower_vfl.secagg.masking import ADVERTS, PARTIES
from flower_vfl.strategies import own_data
from flower_vfl.strategies.exchange import PartyFailed, PartyLost

H = {**HANDLERS, "query.secagg_keys": ca.secagg_keys}
M = 3
#: the default secagg-bound of every party (1e4): scale 2^38, M/(2 scale) = 5.5e-12 per entry
BOUND = FixedPoint([1e4] * M).error_bound
#: the false-alarm rate of each uniformity test on a truly uniform vector
ALPHA = 1e-6


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """a9a (800 training rows, 300 to score) as three party files; one plain training run saves
    the models that every predict job below reads."""
    tmp = tmp_path_factory.mktemp("secagg_predict")
    X, y, Xt, _ = load_all("a9a")
    train, score = write_a9a_files(tmp, X[:800], y[:800], Xt[:300])
    nodes = node_configs(train, score, "csv", tmp)
    rc = run_config(train, score, tmp)
    run_train(rc, nodes)
    return rc, nodes, tmp


def predict(rc, nodes, secagg, grid_cls=LocalGrid, on_reply=None, **kw):
    cfg = dict(rc, mode="predict", secagg=secagg, **kw)
    grid = grid_cls(H, nodes, cfg, on_reply=on_reply)          # fresh Contexts: a new run
    return own_data.predict(grid, cfg), grid


@pytest.fixture(scope="module")
def plain(trained):
    rc, nodes, _ = trained
    seen = {}

    def spy(msg, rep):
        if msg.metadata.message_type == "query.predict":
            seen[msg.metadata.dst_node_id] = rep.content["release"]["s_score"].numpy()
    res, _ = predict(rc, nodes, False, on_reply=spy)
    return res, seen


def test_secure_predict_equals_the_plain_predict_within_the_bound(trained, plain):
    rc, nodes, _ = trained
    res_plain, parts = plain
    res, _ = predict(rc, nodes, True)
    assert res["ids"] == res_plain["ids"] and len(res["ids"]) > 250
    # per entry: |S/scale - sum_m s_m| <= M/(2 scale) against the exact sum; the plain path's own
    # float additions add at most a few ulps of the largest partial sum
    slack = 4 * np.finfo(float).eps * max(np.max(np.abs(sum(parts.values()))), 1.0)
    assert np.max(np.abs(res["scores"] - res_plain["scores"])) <= BOUND + slack
    assert BOUND < 6e-12
    margin = np.abs(res_plain["scores"]) > BOUND + slack            # a label can flip only at |f| ~ 0
    np.testing.assert_array_equal(np.asarray(res["labels"])[margin], np.asarray(res_plain["labels"])[margin])


def test_one_partys_masked_scores_are_uniform_looking_and_the_label_owner_decodes_only_the_sum(trained, plain):
    rc, nodes, _ = trained
    _, parts = plain
    seen, sent = {}, {}

    def spy(msg, rep):
        if msg.metadata.message_type == "query.predict":
            sent[msg.metadata.dst_node_id] = msg
            seen[msg.metadata.dst_node_id] = rep.content["release"]["s_score"].numpy()
    res, grid = predict(rc, nodes, True, on_reply=spy)
    # one request, the same for every party (the broadcast digest binds it)
    digests = {broadcast_digest({}, dict(m.content["config"])) for m in sent.values()}
    assert len(digests) == 1
    roster = Roster([Advert.from_bytes(a) for a in sent[100].content["config"][ADVERTS]])
    fp = roster.fixed_point
    for nid, masked in seen.items():
        assert masked.dtype == np.uint64 and masked.shape == parts[nid].shape
        # (1) Kolmogorov-Smirnov: masked / 2^64 against U(0, 1); the plain encoding, round(s * 2^38)
        # mod 2^64, sits at the two ends (p ~ 0), so the test has the power to see the release
        u = masked.astype(np.float64) / 2.0 ** 64
        assert stats.kstest(u, "uniform").pvalue > ALPHA
        plain_enc = fp.encode(parts[nid], 1e4).astype(np.float64) / 2.0 ** 64
        assert stats.kstest(plain_enc, "uniform").pvalue < 1e-30
        # (2) chi-square of the 8 N bytes over 256 values
        counts = np.bincount(masked.view(np.uint8), minlength=256)
        assert stats.chisquare(counts).pvalue > ALPHA
        # (3) no linear trace of the party's scores: |r| < 0.35 (about 6 standard errors at N ~ 290)
        assert abs(np.corrcoef(masked.view(np.int64).astype(float), parts[nid])[0, 1]) < 0.35
        # (4) a masked entry lands inside the sum's range +-limit with probability 2^-10
        assert np.mean(np.abs(masked.view(np.int64)) <= fp.limit) < 0.05
    # the label owner's decoding: the sum of the three, within M/(2 scale) of the plain sum
    total = secure_sum({roster.names[i]: seen[100 + i] for i in range(M)}, roster)
    exact = sum(parts[100 + i] for i in range(M))
    assert np.max(np.abs(total - exact)) <= fp.error_bound + 4 * np.finfo(float).eps * np.max(np.abs(exact))


class OneOff(LocalGrid):
    """A malicious central node: node 101's predict request differs from the others'."""

    change = None

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            if msg.metadata.message_type == "query.predict" and msg.metadata.dst_node_id == 101:
                cfg = dict(msg.content["config"])
                self.change(cfg)
                msg.metadata.__dict__["_message_id"] = msg.object_id       # as Flower's push does
                other = Message(RecordDict({"config": ConfigRecord(cfg)}), dst_node_id=101,
                                message_type="query.predict")
                [rep] = super().send_and_receive([other], timeout=timeout)
                rep = Message(rep.error, reply_to=msg) if rep.has_error() else Message(rep.content, reply_to=msg)
                if self.on_reply is not None:
                    self.on_reply(msg, rep)
                out.append(rep)
                continue
            out += super().send_and_receive([msg], timeout=timeout)
        return out


def test_a_request_that_differs_for_one_party_gives_garbage_never_a_sum(trained, plain):
    rc, nodes, _ = trained
    _, parts = plain
    seen = {}

    def spy(msg, rep):
        if msg.metadata.message_type == "query.predict":
            seen[msg.metadata.dst_node_id] = (msg, rep.content["release"]["s_score"].numpy())

    class Extra(OneOff):
        change = staticmethod(lambda cfg: cfg.update({"rows": "all"}))     # one more field for party 1
    with pytest.raises(SumMismatch, match="did not mask against the same broadcast"):
        predict(rc, nodes, True, grid_cls=Extra, on_reply=spy)
    roster = Roster([Advert.from_bytes(a) for a in seen[100][0].content["config"][ADVERTS]])
    garbage = roster.fixed_point.decode_sum(unmask_sum({roster.names[i]: seen[100 + i][1] for i in range(M)},
                                                       roster), check=False)
    exact = sum(parts[100 + i] for i in range(M))
    # what the masks leave: entries uniform in Z_2^64, nothing near the sum of the scores
    assert np.mean(np.abs(garbage) > roster.fixed_point.limit / roster.fixed_point.scale) > 0.95
    assert np.mean(np.abs(garbage - exact) > 1e4) > 0.95
    assert stats.kstest((unmask_sum({roster.names[i]: seen[100 + i][1] for i in range(M)}, roster)
                         .astype(float) / 2.0 ** 64), "uniform").pvalue > ALPHA

    # another scoring order named for party 1 (the central node aligned it to other rows): refused
    class OtherOrder(OneOff):
        change = staticmethod(lambda cfg: cfg.update({"order-digest": "0" * 64}))
    with pytest.raises(PartyFailed, match=r"party 1 \(node 101\) failed in the predict request .*config\['order-"
                                          r"digest'\]='0000000000000000' is not the scoring order this party "
                                          r"aligned to"):
        predict(rc, nodes, True, grid_cls=OtherOrder)


def test_a_replay_gets_the_stored_masked_answer_and_another_request_is_refused(trained):
    rc, nodes, _ = trained
    sent = {}

    def spy(msg, rep):
        if msg.metadata.message_type == "query.predict":
            sent[msg.metadata.dst_node_id] = (msg, rep.content["release"]["s_score"].numpy())
    _, grid = predict(rc, nodes, True, on_reply=spy)
    msg, first = sent[101]
    ctx = grid.contexts[101]
    # kept before sent, in the party's own store (its state folder), not in context.state
    from flower_vfl.privacy.store import party_store
    store, owner = party_store(ctx.node_config.get("state-dir")), "partition:1/name:party1"
    key, _ = store.secagg_answer(owner, str(ctx.run_id), "predict")
    assert np.array_equal(store.secagg_masked(owner, str(ctx.run_id), "predict", key), first)
    assert "vfl.secagg.masked.predict" not in ctx.state

    def ask(cfg):
        return ca.psi_party.predict(Message(RecordDict({"config": ConfigRecord(cfg)}), dst_node_id=101,
                                            message_type="query.predict"), ctx)
    cfg = dict(msg.content["config"])
    assert np.array_equal(ask(cfg).content["release"]["s_score"].numpy(), first)               # the same bytes
    with pytest.raises(ReplayConflict, match="round 0 \\(predict\\) was already answered for another broadcast"):
        ask(dict(cfg, rows="all"))
    # the same request in a sum over fewer parties: refused (the difference would be party 2's scores)
    with pytest.raises(ReplayConflict, match=r"already answered in a sum over \[party0,party1,party2\]; refused "
                                             r"in a sum over \[party0,party1\]"):
        ask(dict(cfg, **{PARTIES: ["party0", "party1"]}))
    # the key query again: the same advert (drawn once per run, from the node config alone)
    keys = Message(RecordDict({"config": ConfigRecord({"want": "advert"})}), dst_node_id=101,
                   message_type="query.secagg_keys")
    advert = ca.secagg_keys(keys, ctx).content["secagg"]["advert"]
    assert advert in list(cfg[ADVERTS])


def test_without_pins_the_central_node_reads_the_scores_with_pins_it_is_refused(trained, plain, tmp_path):
    """docs/secagg.md: unpinned keys hold against an honest-but-curious central node only. One
    that relays its own X25519 keys in the other parties' names unmasks party 0's scores; with
    pinned Ed25519 keys party 0 refuses that roster, naming the party and secagg-pins."""
    rc, nodes, _ = trained
    _, parts = plain

    def attack(nodes):
        cfg = dict(rc, mode="predict", secagg=True)
        grid = LocalGrid(H, nodes, cfg)
        ids, _ = own_data.owner_labels(cfg, "score-ids-path", labels=False)
        al = own_data._align(grid, ids, M, "score", cfg, 60)
        ctx = grid.contexts[100]
        keys = Message(RecordDict({"config": ConfigRecord({"want": "advert"})}), dst_node_id=100,
                       message_type="query.secagg_keys")
        mine = ca.secagg_keys(keys, ctx).content["secagg"]["advert"]
        mallory = [KeyAgreement(f"party{i}", str(ctx.run_id), 1e4) for i in (1, 2)]
        adverts = [mine] + [k.advert.to_bytes() for k in mallory]
        from flower_vfl.io import psi
        req = {"split": "score", "order-digest": psi.ids_digest([str(ids[i]) for i in al.order]),
               ADVERTS: adverts, PARTIES: ["party0", "party1", "party2"]}
        rep = ca.psi_party.predict(Message(RecordDict({"config": ConfigRecord(req)}), dst_node_id=100,
                                           message_type="query.predict"), ctx)
        seen = rep.content["release"]["s_score"].numpy()
        ctx_mask = MaskContext(0, "predict", broadcast_digest({}, req))
        own = {}
        for k in mallory:
            s = Session.establish(k, adverts, None)
            own[k.name] = s.release(np.zeros(seen.shape), ctx_mask)
        return secure_sum({"party0": seen, **own}, s.roster), s.roster

    stolen, roster = attack(nodes)
    assert np.max(np.abs(stolen - parts[100])) <= roster.fixed_point.error_bound
    # pinned: every party has an Ed25519 identity and pins the others'
    ids = [Ed25519PrivateKey.generate() for _ in range(M)]
    pinned = {}
    for i in range(M):
        pem = tmp_path / f"party{i}.pem"
        pem.write_bytes(signing_key_pem(ids[i]))
        pins = ", ".join(f"party{j}={public_key_hex(ids[j])}" for j in range(M) if j != i)
        pinned[100 + i] = dict(nodes[100 + i], **{"secagg-signing-key": str(pem), "secagg-pins": pins})
    with pytest.raises(KeyRefused, match="party 'party0': the advert of party 'party1' is not signed by the key "
                                         "pinned for it \\(secagg-pins\\)"):
        attack(pinned)
    res, _ = predict(rc, pinned, True)                  # the honest run with pins
    assert np.max(np.abs(res["scores"] - plain[0]["scores"])) <= 1e-10


def test_a_secagg_only_party_refuses_a_plain_predict(trained):
    rc, nodes, _ = trained
    only = {**nodes, 102: dict(nodes[102], **{"secagg-only": True})}
    with pytest.raises(PartyFailed, match=r"party 2 \(node 102\) failed in the predict request .*party 2 releases "
                                          r"only under secure aggregation \(node config secagg-only\)"):
        predict(rc, only, False)


def test_a_lost_party_means_no_scores_and_its_stored_answer_once_it_is_back(trained, plain):
    rc, nodes, _ = trained
    res_plain, _ = plain

    class Drop(LocalGrid):
        """Party 1's reply to the predict request is lost; a new node with its state (or none,
        ``come_back = False``) serves party 1 from then on."""
        come_back = True

        def send_and_receive(self, messages, *, timeout=None):
            out = []
            for msg in messages:
                [rep] = super().send_and_receive([msg], timeout=timeout)
                if (msg.metadata.dst_node_id == 101 and msg.metadata.message_type == "query.predict"
                        and 201 not in self.contexts and not getattr(self, "dropped", False)):
                    self.dropped = True
                    old = self.contexts.pop(101)
                    if self.come_back:
                        self.contexts[201] = Context(run_id=old.run_id, node_id=201, node_config=dict(old.node_config),
                                                     state=RecordDict(dict(old.state.items())),
                                                     run_config=dict(old.run_config))
                    rep = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node went away"), reply_to=msg)
                out.append(rep)
            return out

    masked = {}

    def spy(msg, rep):
        if msg.metadata.message_type == "query.predict" and rep.has_content():
            masked.setdefault(msg.metadata.dst_node_id, []).append(rep.content["release"]["s_score"].numpy())
    res, grid = predict(rc, nodes, True, grid_cls=Drop, on_reply=spy, **{"party-wait": 2.0})
    assert np.max(np.abs(res["scores"] - res_plain["scores"])) <= 1e-10
    # the node that came back answered with the bytes the lost reply held (its stored answer)
    assert np.array_equal(masked[101][0], masked[201][0])

    class Gone(Drop):
        come_back = False
    with pytest.raises(PartyLost, match=r"part(y|ies).*1"):
        predict(rc, nodes, True, grid_cls=Gone, **{"party-wait": 0.3})


def test_a_predict_job_over_fewer_parties_is_refused_after_one_over_all(trained, plain):
    """A party's scores go into sums over one roster, ever (tests/test_secagg_roster.py): after a
    secure predict job over the three parties, a new job (fresh Contexts) whose request sums
    {party0, party1} only (the difference would be party 2's scores) is refused by party 0 from
    the roster its own disk recorded."""
    rc, nodes, _ = trained
    res, _ = predict(rc, nodes, True)
    assert np.max(np.abs(res["scores"] - plain[0]["scores"])) <= 1e-10

    class Fewer(LocalGrid):
        """A new run (run 2) in which party 0's request names the sum {party0, party1}."""

        def __init__(self, *a, **kw):
            super().__init__(*a, run_id=2, **kw)

        def send_and_receive(self, messages, *, timeout=None):
            out = []
            for msg in messages:
                if msg.metadata.message_type == "query.predict" and msg.metadata.dst_node_id == 100:
                    cfg = dict(msg.content["config"], **{PARTIES: ["party0", "party1"]})
                    msg.metadata.__dict__["_message_id"] = msg.object_id       # as Flower's push does
                    other = Message(RecordDict({"config": ConfigRecord(cfg)}), dst_node_id=100,
                                    message_type="query.predict")
                    [rep] = super().send_and_receive([other], timeout=timeout)
                    out.append(Message(rep.error, reply_to=msg) if rep.has_error() else
                               Message(rep.content, reply_to=msg))
                    continue
                out += super().send_and_receive([msg], timeout=timeout)
            return out

    with pytest.raises(PartyFailed, match=r"party 0 \(node 100\) failed in the predict request .*party 'party0' "
                                          r"answers secure sums over one roster only, \[party0,party1,party2\] "
                                          r"\(recorded in its state folder at its first masked answer\); refused in "
                                          r"a sum over \[party0,party1\]"):
        predict(rc, nodes, True, grid_cls=Fewer)

