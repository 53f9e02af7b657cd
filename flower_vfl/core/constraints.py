"""Constraint sets X_m of a party's block, from their user-facing spellings (no sklearn import:
the party's message handlers import this in a fresh process per message)."""

from __future__ import annotations

from flower_vfl.core.penalties import Ball, Box

__all__ = ["make_constraint"]


def make_constraint(constraint):
    """None, ('ball', r), ('box', lo, hi), or a Ball/Box instance."""
    if constraint is None or isinstance(constraint, (Ball, Box)):
        return constraint
    if isinstance(constraint, (tuple, list)) and constraint and constraint[0] == "ball" and len(constraint) == 2:
        return Ball(constraint[1])
    if isinstance(constraint, (tuple, list)) and constraint and constraint[0] == "box" and len(constraint) == 3:
        return Box(constraint[1], constraint[2])
    raise ValueError(f"constraint={constraint!r} not understood; use None, ('ball', radius) "
                     "or ('box', lower, upper)")
