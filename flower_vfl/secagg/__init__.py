"""Secure aggregation of the parties' releases: the central node recovers only sum_m D_m x_m.

No Flower imports. Building blocks (docs/secagg.md gives the protocol and the threat model):

- :mod:`~flower_vfl.secagg.keys`: signed X25519 adverts, Ed25519 keys pinned in node configs,
  pairwise seeds by HKDF-SHA256;
- :mod:`~flower_vfl.secagg.quantize`: fixed point in Z_{2^64}, error <= M / (2 scale) per entry;
- :mod:`~flower_vfl.secagg.masking`: masks bound to (roster, round, kind, broadcast digest),
  unmasking of a complete roster only, a replay store;
- :mod:`~flower_vfl.secagg.target`: a party's x-update target from the broadcast of the sum.
"""

from flower_vfl.secagg.errors import (KeyRefused, MissingParties, OutOfRange, Rekey, ReplayConflict,
                                      RosterConflict, SecAggError, SumMismatch, TrustRefused)
from flower_vfl.secagg.keys import (Advert, KeyAgreement, Roster, load_signing_key, parse_pins, public_key_hex,
                                    signing_key_pem, verify_roster)
from flower_vfl.secagg.masking import (MaskContext, ReplayStore, Session, broadcast_digest, secure_sum,
                                       unmask_sum)
from flower_vfl.secagg.quantize import FixedPoint
from flower_vfl.secagg.target import broadcast_residual, x_update_target

__all__ = ["Advert", "FixedPoint", "KeyAgreement", "KeyRefused", "MaskContext", "MissingParties", "OutOfRange",
           "Rekey", "ReplayConflict", "ReplayStore", "Roster", "RosterConflict", "SecAggError", "Session",
           "SumMismatch", "TrustRefused", "broadcast_digest", "broadcast_residual", "load_signing_key",
           "parse_pins", "public_key_hex", "secure_sum", "signing_key_pem", "unmask_sum", "verify_roster",
           "x_update_target"]
