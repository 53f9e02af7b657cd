"""Pairwise masks that cancel in the sum of a roster (Bonawitz et al. 2017, without dropout
recovery: a missing party makes the round retry, never a sum with a hole).

Party a releases ``E_a + sum_{b != a} sign(a, b) * PRG(K_ab)`` in Z_{2^64}, with ``E_a`` its
fixed-point release (:mod:`flower_vfl.secagg.quantize`), ``sign = +1`` if a's name sorts before
b's, else -1, and ``K_ab = HKDF-SHA256(seed_ab, info = roster digest, round, kind, broadcast
digest, shape)``: the pair's seed (:mod:`flower_vfl.secagg.keys`) bound to this one message. The
PRG is AES-256-CTR (``cryptography``) with a zero nonce under that single-use key. Summed over the
whole roster every mask appears once with each sign and cancels exactly; any party missing, or
masking against another broadcast, roster, round or kind, leaves masks that are uniform in
Z_{2^64} (:meth:`FixedPoint.decode_sum` then refuses the sum: :class:`SumMismatch`).

:class:`ReplayStore` keeps a party's masked answer per (roster, round, kind): a re-sent request
with the same broadcast gets the stored bytes back, one with another broadcast is refused. (A
fresh answer under the same masks would give the central node the difference of two releases.)
"""

from __future__ import annotations

import hashlib
import numbers
import struct
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flower_vfl.secagg.errors import MissingParties, ReplayConflict, SecAggError
from flower_vfl.secagg.keys import TAG, KeyAgreement, Roster, frame

__all__ = ["broadcast_digest", "MaskContext", "Session", "prg_uint64", "unmask_sum", "secure_sum",
           "ReplayStore", "ADVERTS", "PARTIES"]

#: the message config keys of a request for a masked reply: the relayed roster (list of advert
#: bytes) and the names of the parties of that sum (the Flower glue on both sides reads these)
ADVERTS, PARTIES = "secagg.adverts", "secagg.parties"


# ---------------------------------------------------------------- what the party received
def _encode_value(v: Any) -> bytes:
    if isinstance(v, (bool, np.bool_)):
        return b"b" + (b"\1" if v else b"\0")
    if isinstance(v, numbers.Integral):
        return b"i" + str(int(v)).encode()
    if isinstance(v, numbers.Real):
        return b"f" + struct.pack(">d", float(v))
    if isinstance(v, str):
        return b"s" + v.encode()
    if isinstance(v, (bytes, bytearray)):
        return b"y" + bytes(v)
    if isinstance(v, (list, tuple)):
        return b"l" + frame(*(_encode_value(x) for x in v))
    raise TypeError(f"broadcast value of type {type(v).__name__} has no canonical encoding")


def broadcast_digest(arrays: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None) -> bytes:
    """SHA-256 of a canonical encoding of the broadcast a party received: every array (name,
    little-endian dtype, shape, C-order bytes) and every config value (name, type, value), keys
    sorted. Pass only the fields the central node sends to every party alike."""
    parts = [TAG, b"broadcast"]
    for k in sorted(arrays or {}):
        a = np.asarray(arrays[k])
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        parts.append(frame(b"a", k.encode(), a.dtype.str.encode(), str(a.shape).encode(), a.tobytes()))
    for k in sorted(config or {}):
        parts.append(frame(b"c", k.encode(), _encode_value(config[k])))
    return hashlib.sha256(frame(*parts)).digest()


@dataclass(frozen=True)
class MaskContext:
    """What one masked message is bound to (the run and the parties are in the roster digest)."""

    round: int
    kind: str
    broadcast: bytes

    def __post_init__(self):
        if isinstance(self.round, bool) or not isinstance(self.round, numbers.Integral) or self.round < 0:
            raise SecAggError(f"round={self.round!r}: an integer >= 0")
        if not isinstance(self.kind, str) or not self.kind:
            raise SecAggError(f"kind={self.kind!r}: a non-empty message kind ('train', 'evaluate', ...)")
        if not isinstance(self.broadcast, bytes) or len(self.broadcast) != 32:
            raise SecAggError("broadcast: the 32-byte broadcast_digest of the message received")

    def info(self, roster: Roster, shape) -> bytes:
        return frame(TAG, b"mask", roster.digest, str(int(self.round)).encode(), self.kind.encode(),
                     self.broadcast, str(tuple(int(s) for s in shape)).encode())


def prg_uint64(key: bytes, n: int) -> np.ndarray:
    """n uniform uint64 from AES-256-CTR under a single-use 32-byte key (zero nonce)."""
    enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(enc.update(bytes(8 * n)) + enc.finalize(), dtype="<u8").astype(np.uint64, copy=False)


# ---------------------------------------------------------------- party side
class Session:
    """One party's masking state for a run: its name, the verified roster, its pair seeds."""

    def __init__(self, name: str, roster: Roster, seeds: Mapping[str, bytes]):
        others = set(roster.names) - {name}
        if name not in roster.names or set(seeds) != others:
            raise SecAggError(f"party {name!r}: seeds for {sorted(seeds)} do not match the roster's other "
                              f"parties {sorted(others)}")
        self.name, self.roster, self._seeds = name, roster, dict(seeds)

    @classmethod
    def establish(cls, agreement: KeyAgreement, adverts, pins=None, min_parties: int = 2,
                  required=()) -> "Session":
        roster, seeds = agreement.establish(adverts, pins, min_parties, required)
        return cls(agreement.name, roster, seeds)

    @property
    def bound(self) -> float:
        return self.roster.bound(self.name)

    def net_mask(self, ctx: MaskContext, shape) -> np.ndarray:
        """sum_b sign(a, b) PRG(K_ab), in Z_{2^64}."""
        n = int(np.prod(shape, dtype=np.int64))
        info = ctx.info(self.roster, shape)
        total = np.zeros(n, dtype=np.uint64)
        for other in self.roster.names:
            if other == self.name:
                continue
            key = HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(self._seeds[other])
            stream = prg_uint64(key, n)
            if self.name < other:
                np.add(total, stream, out=total)
            else:
                np.subtract(total, stream, out=total)
        return total.reshape(shape)

    def mask(self, encoded: np.ndarray, ctx: MaskContext) -> np.ndarray:
        """The masked message for an already encoded (uint64) release."""
        encoded = np.asarray(encoded)
        if encoded.dtype != np.uint64:
            raise SecAggError(f"mask(): expected the uint64 fixed-point encoding, got {encoded.dtype}")
        return np.add(encoded, self.net_mask(ctx, encoded.shape))

    def release(self, x, ctx: MaskContext, on_overflow: str = "refuse") -> np.ndarray:
        """Encode the float64 release with this party's declared bound, then mask it."""
        return self.mask(self.roster.fixed_point.encode(x, self.bound, on_overflow), ctx)


# ---------------------------------------------------------------- central node side
def unmask_sum(masked: Mapping[str, np.ndarray], roster: Roster) -> np.ndarray:
    """The modular sum of every roster party's masked message; refuses a partial or foreign set."""
    missing = [n for n in roster.names if n not in masked]
    if missing:
        raise MissingParties(f"no masked release from parties {missing} of the roster {list(roster.names)}: "
                             "their masks would not cancel, so there is no sum with a hole; retry the round "
                             "when they rejoin", missing=missing)
    extra = sorted(set(masked) - set(roster.names))
    if extra:
        raise SecAggError(f"masked releases from {extra}, who are not in the roster {list(roster.names)}")
    arrays = [np.asarray(masked[n]) for n in roster.names]
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1 or any(a.dtype != np.uint64 for a in arrays):
        raise SecAggError(f"masked releases of shapes {sorted(map(str, shapes))} and dtypes "
                          f"{sorted({str(a.dtype) for a in arrays})}: expected one shape, uint64")
    total = arrays[0].copy()
    for a in arrays[1:]:
        np.add(total, a, out=total)               # wraps mod 2^64
    return total


def secure_sum(masked: Mapping[str, np.ndarray], roster: Roster, check: bool = True) -> np.ndarray:
    """sum_m x_m (float64) from the masked messages, within ``roster.fixed_point.error_bound``."""
    return roster.fixed_point.decode_sum(unmask_sum(masked, roster), check=check)


# ---------------------------------------------------------------- replays
class ReplayStore:
    """A party's masked answers: one per (roster, round, kind), with the broadcast it answered.

    ``entries`` is plain data (str -> (32-byte digest, uint64 array)) for the party's own state
    or disk; write it before releasing the answer."""

    def __init__(self, entries: Mapping[str, tuple[bytes, np.ndarray]] | None = None):
        self.entries = dict(entries or {})

    @staticmethod
    def key(roster: Roster, ctx: MaskContext) -> str:
        return f"{roster.digest.hex()}/{int(ctx.round)}/{ctx.kind}"

    def lookup(self, roster: Roster, ctx: MaskContext) -> np.ndarray | None:
        """The stored answer to this very request, ``None`` if new; :class:`ReplayConflict` if
        this (roster, round, kind) was answered for another broadcast."""
        got = self.entries.get(self.key(roster, ctx))
        if got is None:
            return None
        digest, masked = got
        if digest != ctx.broadcast:
            raise ReplayConflict(f"round {ctx.round} ({ctx.kind}) was already answered for another broadcast "
                                 "in this run; refused (one masked answer per round)")
        return masked

    def put(self, roster: Roster, ctx: MaskContext, masked: np.ndarray):
        self.lookup(roster, ctx)                         # never overwrite a different answer
        self.entries[self.key(roster, ctx)] = (ctx.broadcast, np.asarray(masked, dtype=np.uint64))

    def answer(self, roster: Roster, ctx: MaskContext, compute) -> np.ndarray:
        """The stored answer, or ``compute()`` stored then returned."""
        prior = self.lookup(roster, ctx)
        if prior is not None:
            return prior
        masked = compute()
        self.put(roster, ctx, masked)
        return masked
