"""One scoring path for the evaluation rounds during training and the ``predict`` job.

* a party (:func:`party_scores`): its score contribution ``D_m x_m`` on a set of rows. The
  evaluate handler (:meth:`~flower_vfl.clients.vertical_party.VerticalPartyClient.evaluate`,
  held-out rows, x_m in memory) and the predict handler (:func:`flower_vfl.clients.psi_party.predict`,
  scoring rows, x_m from the saved model file) both call it. A private party passes its
  released x̃: it was fitted on row-normalized rows, so the rows are normalized the same way
  (:func:`flower_vfl.privacy.party.normalize_rows`); scoring is post-processing of x̃, free.
* the label owner (:func:`combine`): ``f = sum_m D_m x_m + b`` over the named parties (a
  missing one is an error, never a zero). The strategy's ``aggregate_evaluate`` and
  :func:`flower_vfl.strategies.own_data.predict` both call it; the predict job then decodes
  classes and probabilities with :func:`flower_vfl.core.sklearn_api.decode_scores`, as the
  estimator does.

Who may ask for what (a private party refuses evaluation before its final update, releases x̃
once and stores it) stays in the party's handler; this module holds no state and no Flower
imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from .errors import PartyMissing

__all__ = ["party_scores", "combine"]


def party_scores(D_rows, x, private: bool = False) -> np.ndarray:
    """``D_rows @ x`` as float64: one party's contribution to the scores of ``D_rows``.

    ``D_rows``: the party's preprocessed rows to score (dense or sparse), in the aligned order;
    ``x``: its block (x_m, or for a private party its released x̃, with ``private=True``).
    """
    if private:
        from .privacy.party import normalize_rows
        D_rows = normalize_rows(D_rows)
    return np.asarray(D_rows @ np.asarray(x), dtype=float)


def combine(parts: Mapping[int, np.ndarray], intercept, parties: Iterable[int], what: str = "scores") -> np.ndarray:
    """``f = sum_m parts[m] + intercept`` over ``parties`` (in party order).

    Raises :class:`~flower_vfl.errors.PartyMissing` naming every party in ``parties`` without
    a contribution: a score without one party's block is not the model's score.
    """
    parties = sorted(int(m) for m in parties)
    missing = [m for m in parties if m not in parts]
    if missing:
        raise PartyMissing(f"part{'ies' if len(missing) > 1 else 'y'} {missing} returned no {what}; the score "
                           "needs every party's block (no zero-filling): restart their SuperNodes and run again")
    f = sum(parts[m] for m in parties)
    return f + intercept
