"""Fixed-point encoding of float64 releases into Z_{2^64} for the secure sum.

Party m declares (in its signed key advert, :mod:`flower_vfl.secagg.keys`) an entry-wise bound
B_m on what it releases. Every party and the central node derive the same scale from the
roster's bounds alone: ``scale = 2^k``, the largest power of two with

    sum_m (B_m * scale + 1/2) <= 2^53.

Then each encoded entry ``round(x * scale)`` and the integer sum ``S = sum_m round(x_m * scale)``
satisfy |S| <= 2^53 < 2^63: the sum cannot wrap in Z_{2^64} (read as signed int64), and
``S / scale`` is an exact float64 (an integer of at most 53 bits times a power of two). So the
only error is the rounding of each party's entry, at most 1/(2 scale) each:

    |S / scale - sum_m x_m| <= M / (2 * scale)        per entry,

against the exact real sum of the float64 inputs (:attr:`FixedPoint.error_bound`). At a9a's
scale (B_m = 100, M = 16) the scale is 2^42 and the bound 1.8e-12.

A value outside its party's bound is refused (``on_overflow="refuse"``, for a non-private
party: changing its release silently would change the algorithm) or clipped (``"clip"``, for a
private party's noisy release: clipping after the noise is post-processing, free under DP).
The 11 bits between 2^53 and 2^64 are the check of :meth:`FixedPoint.decode_sum`: masks that
did not cancel leave entries uniform in Z_{2^64}, each inside the range with probability 2^-10.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

import numpy as np

from flower_vfl.secagg.errors import OutOfRange, SumMismatch

__all__ = ["FixedPoint", "EXACT_BITS"]

#: the integer sum stays within 2^EXACT_BITS: exact in float64 and far from wrapping in Z_{2^64}
EXACT_BITS = 53


def _check_bound(b, what) -> float:
    if isinstance(b, bool) or not isinstance(b, (int, float, np.floating, np.integer)) or \
            not math.isfinite(float(b)) or float(b) <= 0.0:
        raise OutOfRange(f"{what}={b!r}: the fixed-point bound must be a finite number > 0 "
                         "(an entry-wise bound on the party's release)")
    return float(b)


class FixedPoint:
    """The fixed-point code of one roster: ``scale = 2^k`` from the declared bounds.

    Parameters
    ----------
    bounds : sequence of float
        B_m, the entry-wise bound each party of the roster declared on its release (> 0).
    """

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(_check_bound(b, f"bounds[{i}]") for i, b in enumerate(bounds))
        if not self.bounds:
            raise OutOfRange("bounds=(): a secure sum needs at least one party's bound")
        m = len(self.bounds)
        total = sum(Fraction(b) for b in self.bounds)
        cap = Fraction(2 ** EXACT_BITS) - Fraction(m, 2)
        k = math.floor(math.log2(cap / total))
        while total * Fraction(2) ** k > cap:       # log2 in float may land one too high
            k -= 1
        while total * Fraction(2) ** (k + 1) <= cap:
            k += 1
        if k < 0:
            raise OutOfRange(f"bounds sum to {float(total):g}: above 2^{EXACT_BITS}, no fixed-point scale >= 1 "
                             "keeps the sum exact; declare smaller bounds")
        self.k = k
        self.scale = float(2.0 ** k)
        self.num_parties = m
        #: |S| <= limit for any inputs within the bounds (what decode_sum checks)
        self.limit = int(math.floor(total * 2 ** k + Fraction(m, 2)))

    @property
    def error_bound(self) -> float:
        """Per entry: |decode_sum(sum of encodes) - exact sum| <= M / (2 scale)."""
        return self.num_parties / (2.0 * self.scale)

    def encode(self, x, bound: float, on_overflow: str = "refuse") -> np.ndarray:
        """``round(x * scale)`` as uint64 (two's complement), shape kept.

        ``bound`` is the encoding party's own declared B_m; entries outside [-B_m, B_m] are
        refused (``on_overflow="refuse"``) or clipped to it (``"clip"``). NaN / inf: refused."""
        bound = _check_bound(bound, "bound")
        if bound not in self.bounds:
            raise OutOfRange(f"bound={bound!r} is not one of the roster's declared bounds {self.bounds}: "
                             "encode with the bound this party declared in its advert")
        x = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise OutOfRange(f"release has {int(np.sum(~np.isfinite(x)))} non-finite entries: nothing to encode")
        if on_overflow == "clip":
            x = np.clip(x, -bound, bound)
        elif on_overflow == "refuse":
            over = np.abs(x) > bound
            if over.any():
                raise OutOfRange(f"{int(over.sum())} entries of the release exceed the declared bound "
                                 f"{bound:g} (max |x| = {float(np.max(np.abs(x))):g}); declare a larger "
                                 "bound (secagg bound) or clip the release")
        else:
            raise ValueError(f"on_overflow={on_overflow!r}: use 'refuse' or 'clip'")
        return np.rint(x * self.scale).astype(np.int64).view(np.uint64)

    def encode_integer(self, r, bits: int) -> np.ndarray:
        """An integer release ``r`` at scale 2^bits (distributed noise, :mod:`flower_vfl.privacy.distributed`)
        as the roster's code: r * 2^(k - bits) in Z_{2^64}, exact (bits <= k). Nothing is clipped or
        refused by value: the noisy integer wraps mod 2^64, so the central node's sum is a
        post-processing of the integer sum; a value far outside the declared bound makes
        :meth:`decode_sum` refuse the sum (a lost round, never a changed release)."""
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 0 <= bits <= self.k:
            raise OutOfRange(f"bits={bits!r}: the integer release's scale 2^bits must be at most the roster's "
                             f"fixed-point scale 2^{self.k}")
        r = np.asarray(r)
        if r.dtype != np.int64:
            raise OutOfRange(f"encode_integer(): expected an int64 release, got {r.dtype}")
        return r.view(np.uint64) * np.uint64(2 ** (self.k - int(bits)))

    def decode_sum(self, total: np.ndarray, check: bool = True) -> np.ndarray:
        """The float64 sum from the modular integer sum (uint64). ``check``: refuse entries
        outside the range the bounds allow (:class:`SumMismatch`: the masks did not cancel)."""
        signed = np.asarray(total, dtype=np.uint64).view(np.int64)
        if check:
            bad = (signed > self.limit) | (signed < -self.limit)    # not abs: |int64 min| wraps
            if bad.any():
                raise SumMismatch(f"{int(bad.sum())} of {bad.size} entries of the unmasked sum are outside "
                                  f"+-{self.limit} (2^{math.log2(self.limit):.1f}): the parties did not mask "
                                  "against the same broadcast and roster, so the masks did not cancel; "
                                  "retry the round with one broadcast for every party")
        return signed.astype(np.float64) / self.scale
