"""Secure aggregation building blocks (flower_vfl.secagg): exact cancellation, the quantization
error bound, garbage on mismatched broadcasts, pinned-key refusals, no sum with a hole, replays,
and the x-update target from the broadcast of the sum alone."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from flower_vfl.secagg import (Advert, FixedPoint, KeyAgreement, KeyRefused, MaskContext, MissingParties,
                               OutOfRange, ReplayConflict, ReplayStore, Roster, Session, SumMismatch,
                               broadcast_digest, broadcast_residual, load_signing_key, parse_pins,
                               public_key_hex, secure_sum, signing_key_pem, unmask_sum, x_update_target)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

RUN = "run-7"


def _parties(m, bounds=None, signed=True, run=RUN):
    """m parties with Ed25519 identities, their adverts and each one's pins of the others."""
    ids = [Ed25519PrivateKey.generate() for _ in range(m)]
    names = [f"party{i:02d}" for i in range(m)]
    bounds = bounds or [10.0] * m
    ags = [KeyAgreement(n, run, b, signing_key=k if signed else None) for n, b, k in zip(names, bounds, ids)]
    pins = {n: k.public_key() for n, k in zip(names, ids)}
    return ags, ids, pins


def _sessions(ags, pins):
    adverts = [a.advert for a in ags]
    return [Session.establish(a, adverts, {n: k for n, k in pins.items() if n != a.name}) for a in ags]


def _ctx(round=3, kind="train", q=None):
    q = np.arange(5.0) if q is None else q
    return MaskContext(round, kind, broadcast_digest({"q": q, "y": -q}, {"rho": 2.0, "round": round}))


@pytest.mark.parametrize("m", range(2, 17))
def test_masks_cancel_exactly(m):
    ags, _, pins = _parties(m)
    sessions = _sessions(ags, pins)
    rng = np.random.default_rng(m)
    xs = [rng.uniform(-10, 10, size=(257,)) for _ in range(m)]
    ctx = _ctx()
    fp = sessions[0].roster.fixed_point
    enc = [fp.encode(x, 10.0) for x in xs]
    masked = {s.name: s.mask(e, ctx) for s, e in zip(sessions, enc)}
    plain = enc[0].copy()
    for e in enc[1:]:
        plain += e
    # the masks cancel bit for bit in Z_{2^64}; no single masked vector equals its encoding
    assert np.array_equal(unmask_sum(masked, sessions[0].roster), plain)
    assert all(np.mean(masked[s.name] == e) < 0.01 for s, e in zip(sessions, enc))
    # every party and the central node derived the same roster and scale
    assert len({s.roster.digest for s in sessions}) == 1
    assert Roster([a.advert for a in ags]).digest == sessions[0].roster.digest


def test_quantization_error_bound_against_exact_sum():
    m, n = 16, 1500
    bounds = [100.0] * 15 + [3.5]
    fp = FixedPoint(bounds)
    # largest power of two with sum_m (B_m scale + 1/2) <= 2^53
    total = sum(bounds)
    assert fp.scale == 2.0 ** 42 and total * 2 ** 43 + 8 > 2 ** 53 >= total * 2 ** 42 + 8
    assert fp.error_bound == m / 2.0 ** 43 == pytest.approx(1.82e-12, rel=1e-2)
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-b, b, n) * rng.choice([1.0, 1e-7, 1e-13], n) for b in bounds]
    xs[0][:3] = [100.0, -100.0, np.nextafter(100.0, 0)]           # the bound itself is inside
    S = fp.encode(xs[0], 100.0)
    for x, b in zip(xs[1:], bounds[1:]):
        S = S + fp.encode(x, b)
    got = fp.decode_sum(S)
    exact = [sum(Fraction(float(x[i])) for x in xs) for i in range(n)]
    err = np.array([abs(Fraction(float(g)) - e) for g, e in zip(got, exact)], dtype=float)
    assert err.max() <= fp.error_bound
    assert err.max() > fp.error_bound / 4          # the bound is of the right order, not loose by far
    # the extreme sum (every party at +B_m) neither wraps nor loses exactness
    top = fp.encode(np.full(2, 100.0), 100.0)
    S = sum([top] * 15, fp.encode(np.full(2, 3.5), 3.5))
    assert np.all(fp.decode_sum(S) == 1503.5)


def test_out_of_range_values_refused_or_clipped():
    fp = FixedPoint([2.0, 5.0])
    with pytest.raises(OutOfRange, match=r"1 entries of the release exceed the declared bound 2 \(max \|x\| = 2.5\)"):
        fp.encode(np.array([0.0, -2.5]), 2.0)
    assert np.array_equal(fp.decode_sum(fp.encode(np.array([0.0, -2.5]), 2.0, on_overflow="clip")), [0.0, -2.0])
    with pytest.raises(OutOfRange, match="non-finite"):
        fp.encode(np.array([np.nan]), 2.0)
    with pytest.raises(OutOfRange, match=r"bound=3.0 is not one of the roster's declared bounds"):
        fp.encode(np.zeros(1), 3.0)
    with pytest.raises(OutOfRange, match=r"bounds\[1\]=-1.0: the fixed-point bound must be a finite number > 0"):
        FixedPoint([1.0, -1.0])


@pytest.mark.parametrize("what", ["broadcast", "round", "kind", "roster"])
def test_mismatched_binding_gives_garbage_not_a_sum(what):
    m, n = 4, 2000
    ags, _, pins = _parties(m)
    sessions = _sessions(ags, pins)
    roster = sessions[0].roster
    rng = np.random.default_rng(1)
    xs = [rng.uniform(-10, 10, n) for _ in range(m)]
    ctx = _ctx()
    odd = {"broadcast": _ctx(q=np.arange(5.0) + 1e-9),      # one entry of q differs by 1e-9
           "round": _ctx(round=4), "kind": _ctx(kind="evaluate"), "roster": ctx}[what]
    masked = {s.name: s.release(x, ctx) for s, x in zip(sessions[:-1], xs[:-1])}
    last = sessions[-1]
    if what == "roster":      # the last party was shown a roster in which party00 has another key
        fake = list(a.advert for a in ags)
        fake[0] = KeyAgreement(fake[0].name, RUN, 10.0).advert
        last = Session.establish(ags[-1], fake, None)
    masked[last.name] = last.release(xs[-1], odd)
    true = np.sum(xs, axis=0)
    raw = secure_sum(masked, roster, check=False)
    # garbage: off by far more than the quantization bound, nearly everywhere
    assert np.median(np.abs(raw - true)) > 1e12 * roster.fixed_point.error_bound
    assert np.mean(np.abs(raw - true) > 1.0) > 0.99
    with pytest.raises(SumMismatch, match=r"of 2000 entries of the unmasked sum are outside .* the masks did not "
                                          r"cancel"):
        secure_sum(masked, roster)
    # the same parties against one broadcast: the sum, to the bound
    masked[last.name] = sessions[-1].release(xs[-1], ctx)
    assert np.max(np.abs(secure_sum(masked, roster) - true)) <= roster.fixed_point.error_bound + 4e-15


def test_wrong_pinned_key_refused():
    ags, ids, pins = _parties(3)
    adverts = [a.advert for a in ags]
    bad = dict(pins)
    bad["party01"] = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(KeyRefused, match=r"party 'party00': the advert of party 'party01' is not signed by the key "
                                         r"pinned for it \(secagg-pins\); refused"):
        Session.establish(ags[0], adverts, bad)
    # a party nobody pinned, an advert re-signed by the server, a forged bound: refused
    with pytest.raises(KeyRefused, match=r"party 'party02' has no pinned key in this party's node config"):
        Session.establish(ags[0], adverts, {"party01": pins["party01"]})
    server = Ed25519PrivateKey.generate()
    a2 = adverts[2]
    forged = Advert(a2.name, a2.run, a2.dh_public, 1e6)
    forged = Advert(forged.name, forged.run, forged.dh_public, forged.bound, server.sign(forged.signed_bytes()))
    with pytest.raises(KeyRefused, match="the advert of party 'party02' is not signed by the key pinned"):
        Session.establish(ags[0], adverts[:2] + [forged], pins)
    # the correct pins pass
    assert Session.establish(ags[0], adverts, pins).roster.names == ("party00", "party01", "party02")


def test_without_pins_a_malicious_server_reads_a_release_with_pins_it_cannot():
    """The threat model of docs/secagg.md: unpinned keys protect against an honest-but-curious
    central node only. A server that swaps in its own X25519 keys learns every pair seed."""
    ags, ids, pins = _parties(2, signed=True)
    victim = ags[0]
    mallory = KeyAgreement("party01", RUN, 10.0)                  # the server's key, in party01's name
    x = np.random.default_rng(2).uniform(-10, 10, 100)
    ctx = _ctx()
    s = Session.establish(victim, [victim.advert, mallory.advert], None)        # unpinned: accepted
    seen = s.release(x, ctx)
    # the server plays party01 against the victim: its own mask cancels the victim's
    m_server = Session.establish(mallory, [victim.advert, mallory.advert], None)
    stolen = secure_sum({"party00": seen, "party01": m_server.release(np.zeros(100), ctx)}, s.roster)
    assert np.max(np.abs(stolen - x)) <= s.roster.fixed_point.error_bound
    with pytest.raises(KeyRefused, match="the advert of party 'party01' is not signed by the key pinned"):
        Session.establish(victim, [victim.advert, mallory.advert], {"party01": pins["party01"]})


def test_roster_refusals():
    ags, ids, pins = _parties(3)
    adverts = [a.advert for a in ags]
    a0 = adverts[0]
    swapped = Advert(a0.name, a0.run, KeyAgreement("x", RUN, 1.0).advert.dh_public, a0.bound, a0.signature)
    with pytest.raises(KeyRefused, match="does not contain this party's own advert unchanged"):
        Session.establish(ags[0], [swapped] + adverts[1:], pins)
    other_run = KeyAgreement("party02", "run-8", 10.0, signing_key=ids[2]).advert
    with pytest.raises(KeyRefused, match=r"adverts of \['party02'\] are for another run than 'run-7'"):
        Session.establish(ags[0], adverts[:2] + [other_run], pins)
    with pytest.raises(KeyRefused, match=r"a secure sum of 3 parties is below this party's minimum of 4 "
                                         r"\(node config secagg-min-parties\)"):
        Session.establish(ags[0], adverts, pins, min_parties=4)
    with pytest.raises(KeyRefused, match=r"a secure sum of 1 parties is below this party's minimum of 2"):
        Session.establish(ags[0], adverts[:1], pins)
    with pytest.raises(KeyRefused, match=r"the roster lacks parties \['party02'\] that this party requires "
                                         r"\(node config secagg-require\)"):
        Session.establish(ags[0], adverts[:2], pins, required=sorted(pins))
    with pytest.raises(KeyRefused, match=r"names parties \['party01'\] more than once"):
        Session.establish(ags[0], adverts + [adverts[1]], pins)
    # the wire form round-trips; a truncated one is refused
    assert Advert.from_bytes(a0.to_bytes()) == a0
    with pytest.raises(KeyRefused, match="malformed key advert"):
        Advert.from_bytes(a0.to_bytes()[:-3])


def test_partial_set_refused_naming_the_missing():
    ags, _, pins = _parties(5)
    sessions = _sessions(ags, pins)
    ctx = _ctx()
    masked = {s.name: s.release(np.ones(7), ctx) for s in sessions if s.name not in ("party01", "party03")}
    with pytest.raises(MissingParties, match=r"no masked release from parties \['party01', 'party03'\] of the "
                                             r"roster .*no sum with a hole; retry the round") as e:
        unmask_sum(masked, sessions[0].roster)
    assert e.value.missing == ("party01", "party03")


def test_replay_returns_the_stored_answer_and_refuses_another_broadcast():
    ags, _, pins = _parties(2)
    s = _sessions(ags, pins)[0]
    store = ReplayStore()
    ctx = _ctx()
    calls = []
    first = store.answer(s.roster, ctx, lambda: calls.append(1) or s.release(np.ones(5), ctx))
    again = store.answer(s.roster, ctx, lambda: calls.append(1) or s.release(np.full(5, 2.0), ctx))
    assert again is first and calls == [1]
    with pytest.raises(ReplayConflict, match=r"round 3 \(train\) was already answered for another broadcast"):
        store.answer(s.roster, _ctx(q=np.zeros(5)), lambda: s.release(np.ones(5), ctx))
    assert store.answer(s.roster, _ctx(kind="evaluate"), lambda: np.zeros(5, np.uint64)).sum() == 0


def test_masked_release_looks_uniform():
    ags, _, pins = _parties(3)
    s = _sessions(ags, pins)[0]
    masked = s.release(np.zeros(32561), _ctx())         # an all-zero release
    bits = np.unpackbits(masked.view(np.uint8)).reshape(-1, 64).mean(axis=0)
    assert np.all(np.abs(bits - 0.5) < 5 * 0.5 / np.sqrt(32561))   # every bit position ~ fair


def test_broadcast_digest_is_canonical():
    q = np.linspace(0, 1, 6)
    d = broadcast_digest({"q": q, "y": q[::-1]}, {"rho": 1.0, "round": 2})
    assert d == broadcast_digest({"y": q[::-1].copy(), "q": q.astype(">f8")}, {"round": 2, "rho": 1.0})
    assert d != broadcast_digest({"q": q, "y": q[::-1]}, {"rho": 1.0, "round": 2.0})     # int vs float
    assert d != broadcast_digest({"q": q.reshape(2, 3), "y": q[::-1]}, {"rho": 1.0, "round": 2})


def test_keys_from_node_config(tmp_path):
    k = Ed25519PrivateKey.generate()
    (tmp_path / "p.pem").write_bytes(signing_key_pem(k))
    assert public_key_hex(load_signing_key(tmp_path / "p.pem")) == public_key_hex(k)
    pins = parse_pins(f"bank={public_key_hex(k)},\n clinic = {public_key_hex(k.public_key())}")
    assert sorted(pins) == ["bank", "clinic"]
    with pytest.raises(KeyRefused, match=r"secagg-pins entry 'bank=abc': write name=<64 hex digits"):
        parse_pins("bank=abc")
    (tmp_path / "bad.pem").write_text("nope")
    with pytest.raises(KeyRefused, match=r"secagg-signing-key .*bad.pem.*openssl genpkey -algorithm ed25519"):
        load_signing_key(tmp_path / "bad.pem")


@pytest.mark.parametrize("alpha,theta", [(1.0, 1.0), (1.0, 1 / 3), (1.6, 0.5)])
def test_x_update_target_from_the_sum_equals_todays(alpha, theta):
    """v_m from u = z - a_hat - y/rho and the party's own s_m (and z_loc_m) equals the target
    PartyUpdate.step forms from today's q = a_hat - z."""
    from flower_vfl.core.central import CentralUpdate
    from flower_vfl.core.losses import get_loss
    from flower_vfl.core.party import PartyUpdate
    from flower_vfl.core.penalties import get_penalty

    rng = np.random.default_rng(5)
    n, rho = 300, 0.7
    blocks = [rng.standard_normal((n, d)) / 3 for d in (4, 6, 3)]
    t = np.sign(rng.standard_normal(n))
    parties = [PartyUpdate(D, get_penalty("l2"), 1e-3, v_clip=np.inf) for D in blocks]
    central = CentralUpdate(get_loss("logistic"), t, rho, alpha=alpha, theta=theta)
    for _ in range(4):                                   # a few plain rounds: a mid-run state
        s_sum = 0.0
        for p in parties:
            p.commit(p.step(central.q, central.y, rho, alpha, theta))
            s_sum = s_sum + p.s
        z_prev = central.z.copy()
        central.step(s_sum)
    a_hat = alpha * s_sum + (1 - alpha) * z_prev
    u = broadcast_residual(central.z, a_hat, central.y, rho)
    for p in parties:
        s_own, z_loc_own = p.s.copy(), p.z_loc.copy()
        ours = x_update_target(u, s_own, theta, alpha, z_loc_own)
        p.step(central.q, central.y, rho, alpha, theta)
        assert np.max(np.abs(ours - p.last_target)) <= 1e-12
    with pytest.raises(ValueError, match="z_loc_own: needed with alpha != 1"):
        x_update_target(u, s_own, theta, 1.5)


def test_the_noise_profile_is_an_optional_signed_field_of_the_advert():
    """An advert without a profile has the bytes of the format before the field existed (6 signed
    fields); with one, the profile is signed: a server that adds, drops or changes it (to make a
    party count adders that add no noise) breaks the signature pinned for that party."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey as Key
    from flower_vfl.secagg.keys import TAG, frame, unframe, verify_roster
    import struct
    sk = Key.generate()
    plain = KeyAgreement("party01", RUN, 10.0, sk).advert
    signed, _ = unframe(plain.to_bytes())
    assert unframe(signed) == [TAG, b"advert", b"party01", RUN.encode(), plain.dh_public, struct.pack(">d", 10.0)]
    prof = b"skellam/v1;k=0;eps=1.0"
    noisy = KeyAgreement("party01", RUN, 10.0, sk, dh_private=None, noise=prof).advert
    back = Advert.from_bytes(noisy.to_bytes())
    assert back == noisy and back.noise == prof and len(unframe(unframe(noisy.to_bytes())[0])) == 7
    own = KeyAgreement("party00", RUN, 10.0, Key.generate())
    pins = {"party01": sk.public_key()}
    assert verify_roster([own.advert, noisy], pins, own.advert).names == ("party00", "party01")
    for forged in (Advert(noisy.name, noisy.run, noisy.dh_public, noisy.bound, noisy.signature, b"skellam/v1;k=9"),
                   Advert(noisy.name, noisy.run, noisy.dh_public, noisy.bound, noisy.signature),
                   Advert(plain.name, plain.run, plain.dh_public, plain.bound, plain.signature, prof)):
        with pytest.raises(KeyRefused, match="the advert of party 'party01' is not signed by the key pinned"):
            verify_roster([own.advert, forged], pins, own.advert)
    with pytest.raises(KeyRefused, match="malformed key advert"):       # an empty 7th field is not an advert
        Advert.from_bytes(frame(frame(*unframe(signed), b""), b""))
