"""The refusals of the secure sum, each naming the party, key or argument and the fix."""

from __future__ import annotations

from flower_vfl.errors import UserError

__all__ = ["SecAggError", "KeyRefused", "Rekey", "MissingParties", "OutOfRange", "SumMismatch", "ReplayConflict",
           "RosterConflict", "TrustRefused"]


class SecAggError(UserError, RuntimeError):
    """Base class: a secure-aggregation step that will not go ahead (``code`` says why)."""

    code = "secagg"


class KeyRefused(SecAggError):
    """A key advert that fails authentication (signature, pin, run) or is malformed."""

    code = "secagg-key"


class Rekey(KeyRefused):
    """The party holds no key for this run (a restarted node): the central node must ask for
    its advert again and relay a new roster, then retry the round."""

    code = "secagg-rekey"


class MissingParties(SecAggError):
    """Unmasking with a hole: some parties of the roster sent no masked release."""

    code = "secagg-missing"

    def __init__(self, message, missing=()):
        super().__init__(message)
        self.missing = tuple(missing)


class OutOfRange(SecAggError, ValueError):
    """A value outside the fixed-point range a party declared (its ``bound``)."""

    code = "secagg-range"


class SumMismatch(SecAggError):
    """The unmasked sum is outside the range the declared bounds allow: the parties did not
    mask against the same broadcast (or roster), so the pairwise masks did not cancel."""

    code = "secagg-mismatch"


class ReplayConflict(SecAggError):
    """The same (roster, round, kind) asked again with a different broadcast."""

    code = "secagg-replay"


class RosterConflict(SecAggError):
    """A sum over another set of parties than the one roster this party answers sums over (its
    own disk keeps it): the central node could subtract the two sums."""

    code = "secagg-roster"


class TrustRefused(KeyRefused):
    """Secure aggregation on a deployed party without pinned keys, whose node config does not
    accept an honest-but-curious central node."""

    code = "secagg-trust"
