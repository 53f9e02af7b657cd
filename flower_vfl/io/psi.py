"""ECDH private set intersection of sample IDs (openmined-psi), as bytes messages.

No Flower imports: the Flower strategy (:mod:`flower_vfl.strategies.psi_align`) and the
party handlers (:mod:`flower_vfl.clients.psi_party`) only carry these bytes.

Roles. The label owner must learn which of its rows every party holds; in openmined-psi the
side that learns the intersection is the PSI *client*. So the label owner is the PSI client
(it holds the key ``a``) and each party is a PSI *server* (key ``k_m``, fresh per request):

1. label owner -> party: ``request`` = {H(x)^a : x in the label owner's IDs}, in a secret random
   order, under its kept key a (:func:`label_owner_key`: the same item for the same ID in every run).
2. party -> label owner: ``setup`` = {H(p)^k_m : p in the party's IDs}, sorted by the library
   (the party's row order is not revealed), and ``response`` = {H(x)^(a k_m)} for the request.
3. the label owner removes ``a`` and matches: it learns which of its own rows the party holds.
4. the label owner intersects over all parties (:func:`agree_order`) and sends each party the
   agreed IDs, in the label owner's row order; the party checks it holds every one.

What each side learns (semi-honest, DDH in the P-256 group; see docs/own-data.md):

* label owner: |P_m| and its own IDs that are in P_m (the pairwise intersection), for every
  party m; nothing about a party's other IDs (they reach it only as H(p)^k_m).
* party m: |L| (the number of items in the request), then the agreed intersection
  I = L ∩ P_1 ∩ ... ∩ P_M (which it must know to train on those rows); not L ∩ P_m \\ I,
  not L \\ P_m, not the other parties' sets beyond what I itself implies.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from flower_vfl.errors import UserError

__all__ = ["LabelOwnerPSI", "label_owner_key", "request_items", "party_answer", "agree_order", "encode_ids", "decode_ids", "ids_digest",
           "AlignmentError", "DATA_STRUCTURES"]

DATA_STRUCTURES = ("raw", "gcs", "bloom")


class AlignmentError(UserError, ValueError):
    """The parties' IDs cannot be aligned (no or too few common IDs, a bad PSI message)."""


def _psi():
    import private_set_intersection.python as psi
    return psi


def _structure(name: str):
    psi = _psi()
    table = {"raw": psi.DataStructure.RAW, "gcs": psi.DataStructure.GCS,
             "bloom": psi.DataStructure.BLOOM_FILTER}
    if name not in table:
        raise ValueError(f"psi-structure={name!r}; choose one of {DATA_STRUCTURES} (raw is exact; gcs and "
                         "bloom are smaller with false-positive rate psi-fpr)")
    return table[name]


def _as_items(ids) -> list[str]:
    return [str(v) for v in (ids.tolist() if isinstance(ids, np.ndarray) else ids)]


class LabelOwnerPSI:
    """The label owner's side: one key ``a`` for a whole alignment (all parties, one split).

    Parameters
    ----------
    ids : sequence of str
        The label owner's IDs in its row order (unique).
    key : 'kept', 'fresh' or bytes, default='kept'
        'kept': the label owner's PSI key kept in its state folder (:func:`label_owner_key`), so a
        party's PSI log (:mod:`flower_vfl.io.psi_log`) counts an ID asked again in a later run
        once; 'fresh': a new key (every ID asked counts as new there); or 32 key bytes.
    state_dir : str or None
        Where the kept key lives (None: ``$FLOWER_VFL_STATE_DIR``, else ``~/.flower-vfl/party-state``).
    """

    def __init__(self, ids, key="kept", state_dir=None):
        psi = _psi()
        self.ids = _as_items(ids)
        # reveal_intersection: it learns L ∩ P_m. The kept key (label_owner_key) gives one ID the
        # same blinded item in every alignment, so a party's PSI log counts a re-asked ID once
        if isinstance(key, str) and key not in ("kept", "fresh"):
            raise ValueError(f"key={key!r}; give 'kept' (label_owner_key), 'fresh' or 32 key bytes")
        if key == "fresh":
            self._client = psi.client.CreateWithNewKey(True)
        else:
            raw = label_owner_key(state_dir) if key == "kept" else bytes(key)
            self._client = psi.client.CreateFromKey(raw, True)
        # the request lists the IDs in a secret random order: the agreed order (plaintext, the
        # label owner's row order) then cannot be matched to blinded items by position
        self._perm = np.random.default_rng().permutation(len(self.ids))
        self._request = None

    def request(self) -> bytes:
        """Step 1: {H(x)^a}, the same bytes for every party."""
        if self._request is None:
            self._request = self._client.CreateRequest([self.ids[i] for i in self._perm]).SerializeToString()
        return self._request

    def intersect(self, setup: bytes, response: bytes, who: str = "party") -> np.ndarray:
        """Step 3: sorted indices of the label owner's rows that the party also holds."""
        psi = _psi()
        try:
            s, r = psi.ServerSetup(), psi.Response()
            s.ParseFromString(setup)
            r.ParseFromString(response)
            idx = self._client.GetIntersection(s, r)
        except Exception as exc:   # a malformed message names the sender
            raise AlignmentError(f"{who} sent a malformed PSI reply ({type(exc).__name__}: {exc}); check that "
                                 "it runs the same flower-vfl / openmined-psi version") from None
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self.ids)):
            raise AlignmentError(f"{who} sent a PSI reply naming rows outside the request")
        return np.unique(self._perm[idx])


def label_owner_key(state_dir=None) -> bytes:
    """The label owner's PSI key, kept in ``<state_dir>/label-owner-psi.key`` (mode 0600; made on
    first use; default folder ``$FLOWER_VFL_STATE_DIR``, else ``~/.flower-vfl/party-state``: the label
    owner's, so a ServerApp in a deployed process is not held to a SuperNode's ``state-dir`` rule).

    With it the label owner asks about one ID with the same blinded item in every run, so the
    parties' PSI logs (distinct items asked, capped) count a re-asked ID once; a party can then
    tell that two requests share IDs (how many), nothing about which."""
    import os
    from pathlib import Path
    if state_dir is None:   # the label owner's, not a party's: no SuperNode's state-dir rule applies
        env = os.environ.get("FLOWER_VFL_STATE_DIR")
        state_dir = Path(env) if env else Path.home() / ".flower-vfl" / "party-state"
    path = Path(state_dir) / "label-owner-psi.key"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = _psi().client.CreateWithNewKey(True).GetPrivateKeyBytes()
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)                 # first writer wins: two processes agree on one key
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    key = path.read_bytes()
    if len(key) != 32:
        raise AlignmentError(f"{path} holds {len(key)} bytes, not a 32-byte PSI key; restore it from a backup "
                             "(a new key makes every ID the label owner asks count as new at the parties)")
    return key


def request_items(request: bytes) -> list[bytes]:
    """The blinded items {H(x)^a} of a label owner's request (what a party can count, not read)."""
    psi = _psi()
    req = psi.Request()
    try:
        req.ParseFromString(bytes(request))
    except Exception as exc:
        raise AlignmentError(f"the label owner's PSI request is malformed ({exc})") from None
    return list(req.encrypted_elements)


def party_answer(ids, request: bytes, fpr: float = 1e-9, structure: str = "raw",
                 max_request: int = 0) -> tuple[bytes, bytes]:
    """Step 2, the party's side: (setup, response) for the label owner's request.

    A fresh key k_m per call, so two requests cannot be linked. ``max_request`` > 0 refuses
    requests with more items (a label owner probing many guessed IDs)."""
    psi = _psi()
    req = psi.Request()
    try:
        req.ParseFromString(request)
    except Exception as exc:
        raise AlignmentError(f"the label owner's PSI request is malformed ({exc})") from None
    n_req = len(req.encrypted_elements)
    if max_request and n_req > max_request:
        raise AlignmentError(f"the label owner asked about {n_req} IDs, more than this party's psi-max-request="
                             f"{max_request}; raise that node-config key if the label owner really holds "
                             "that many rows")
    server = psi.server.CreateWithNewKey(True)
    items = _as_items(ids)
    setup = server.CreateSetupMessage(float(fpr), max(n_req, 1), items, _structure(structure))
    return setup.SerializeToString(), server.ProcessRequest(req).SerializeToString()


def agree_order(n_owner: int, pairwise: dict, min_rows: int = 2, what: str = "training") -> np.ndarray:
    """Label-owner rows common to every party, in the label owner's order.

    ``pairwise`` maps a party to the label-owner row indices it holds (from
    :meth:`LabelOwnerPSI.intersect`)."""
    keep = np.ones(n_owner, dtype=bool)
    for m, idx in sorted(pairwise.items()):
        mask = np.zeros(n_owner, dtype=bool)
        mask[idx] = True
        if not mask.any():
            raise AlignmentError(f"party {m} has no {what} ID in common with the label owner's {n_owner} rows; "
                                 "check that both exports use the same ID column and format (e.g. "
                                 "'00123' vs '123')")
        keep &= mask
    order = np.flatnonzero(keep)
    if order.size < min_rows:
        raise AlignmentError(f"only {order.size} {what} ID(s) are common to the label owner and all "
                             f"{len(pairwise)} parties (pairwise: "
                             f"{ {m: int(len(i)) for m, i in sorted(pairwise.items())} }); at least {min_rows} "
                             "are needed: check the parties' exports cover the same samples")
    return order


def encode_ids(ids) -> bytes:
    return json.dumps(_as_items(ids)).encode("utf-8")


def decode_ids(blob: bytes) -> list[str]:
    return json.loads(bytes(blob).decode("utf-8"))


def ids_digest(ids) -> str:
    """SHA-256 of the ordered ID list: both sides check they hold the same agreed order."""
    return hashlib.sha256(encode_ids(ids)).hexdigest()
