"""ECDH-PSI (flower_vfl.io.psi): intersections against plain set logic, what each message holds."""

import numpy as np
import pytest

from flower_vfl.io import psi as psi
from flower_vfl.io.psi import AlignmentError, LabelOwnerPSI, agree_order, party_answer


def _sets(seed=0, n_owner=500, n_party=700, common=300):
    rng = np.random.default_rng(seed)
    pool = [f"cust-{v:07d}" for v in rng.choice(10**7, n_owner + n_party, replace=False)]
    owner = pool[:n_owner]
    party = owner[:common] + pool[n_owner:n_owner + n_party - common]
    return owner, [party[i] for i in rng.permutation(len(party))]


@pytest.mark.parametrize("structure", ["raw", "gcs", "bloom"])
def test_intersection_equals_set_logic(structure):
    owner, party = _sets()
    lo = LabelOwnerPSI(owner)
    setup, response = party_answer(party, lo.request(), fpr=1e-9, structure=structure)
    idx = lo.intersect(setup, response)
    want = sorted(i for i, v in enumerate(owner) if v in set(party))
    assert idx.tolist() == want and len(want) == 300


def test_agreed_order_is_the_owners_order_over_all_parties():
    owner, p1 = _sets(1)
    p2 = owner[100:450] + ["zzz"]
    lo = LabelOwnerPSI(owner)
    pair = {}
    for m, party in ((1, p1), (2, p2)):
        pair[m] = lo.intersect(*party_answer(party, lo.request()))
    order = agree_order(len(owner), pair)
    assert [owner[i] for i in order] == [v for v in owner if v in set(p1) and v in set(p2)]
    with pytest.raises(AlignmentError, match=r"party 3 has no training ID in common"):
        agree_order(len(owner), {**pair, 3: np.array([], dtype=int)})


def test_messages_hold_no_plaintext_id_and_keys_are_fresh():
    owner, party = _sets(2)
    lo = LabelOwnerPSI(owner)
    request = lo.request()
    a = party_answer(party, request)
    b = party_answer(party, request)
    for blob in (request, *a, *b):
        assert b"cust-" not in blob
    assert a[0] != b[0] and a[1] != b[1]                    # a fresh party key per request: unlinkable
    # the label owner learns |P| (raw setup: one 33-byte point + 2 bytes of framing per party ID)
    assert abs(len(a[0]) - 35 * len(party)) < 64 and abs(len(request) - 35 * len(owner)) < 64


def test_party_caps_the_request_size_and_malformed_replies_are_named():
    owner, party = _sets(3)
    lo = LabelOwnerPSI(owner)
    with pytest.raises(AlignmentError, match=r"asked about 500 IDs, more than this party's psi-max-request=400"):
        party_answer(party, lo.request(), max_request=400)
    with pytest.raises(AlignmentError, match=r"party 1 \(node 7\) sent a malformed PSI reply"):
        lo.intersect(b"\x00garbage", b"\x01garbage", who="party 1 (node 7)")


def test_ids_roundtrip_and_digest():
    ids = ["a", "b,c", "d\ne", "ünï"]
    assert psi.decode_ids(psi.encode_ids(ids)) == ids
    assert psi.ids_digest(ids) != psi.ids_digest(ids[::-1])


def test_the_label_owners_kept_key_is_not_held_to_a_supernodes_state_dir_rule(tmp_path, monkeypatch):
    """A deployed ServerApp runs in a process named like a SuperNode's executor (warm_exec.py): its
    kept PSI key still goes to its own default folder, never a StateDirRequired naming a SuperNode."""
    import sys
    from flower_vfl.io.psi import label_owner_key
    from flower_vfl.privacy.store import deployed_supernode
    monkeypatch.setattr(sys, "argv", ["/x/warm_exec.py"])
    monkeypatch.delenv("FLOWER_VFL_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert deployed_supernode()
    key = label_owner_key()
    path = tmp_path / ".flower-vfl" / "party-state" / "label-owner-psi.key"
    assert path.read_bytes() == key and len(key) == 32 and (path.stat().st_mode & 0o777) == 0o600
    assert label_owner_key() == key                     # kept: the same key next run
