"""Label differential privacy for the label owner (the central node): randomized response.

The label owner privatizes its training labels **once, before training**: each binary label
is kept with probability e^ε / (1 + e^ε) and flipped otherwise (Warner's randomized response).
Changing one training label changes the probability of any output vector by at most e^ε, so
the privatized labels are ε-label-DP (pure, δ = 0) under the "replace one training label"
relation. Training then uses only the privatized labels (with the forward-corrected loss of
:mod:`flower_vfl.core.label_noise`), so every dual y a party ever receives, every z, the
intercept and the model are post-processing of them: no further label-privacy cost.

The ε reported is answered by dp-accounting (``RandomizedResponseDpEvent`` under a
``REPLACE_ONE`` PLD accountant) for the mechanism actually run, never a constant of this code.
No Flower imports here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["LabelPrivacy", "flip_probability", "randomized_response", "label_dp_event",
           "label_epsilon_spent", "check_label_epsilon", "privatize_labels"]

NEIGHBOURING_RELATION = "replace one training label (label-DP); features are not covered"


def check_label_epsilon(epsilon, name="label_epsilon"):
    """None / 0 / inf -> None (off or no noise is handled by the caller); else a float > 0.

    ``inf`` is accepted and means "no label privacy" (flip probability 0)."""
    if epsilon is None:
        return None
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={epsilon!r} is not a number; give a label-DP epsilon > 0, "
                         "or 0 / None to train on the true labels") from None
    if math.isnan(eps) or eps < 0:
        raise ValueError(f"{name}={epsilon!r} must be > 0 (0 or None: labels not protected)")
    if eps == 0.0 or math.isinf(eps):
        return None
    return eps


def flip_probability(epsilon: float) -> float:
    """p = 1 / (1 + e^ε): the probability that randomized response flips a binary label."""
    eps = check_label_epsilon(epsilon, "epsilon")
    return 0.0 if eps is None else float(1.0 / (1.0 + math.exp(eps)))


def _generator(seed):
    """A numpy Generator: from OS entropy for ``None``, from an int seed, or passed through
    (anything with ``random(n)``, e.g. an ``np.random.Generator``)."""
    if seed is None or isinstance(seed, (int, np.integer)):
        return np.random.default_rng(seed)          # None: fresh OS entropy (SeedSequence)
    if hasattr(seed, "random"):
        return seed
    raise ValueError(f"seed={seed!r} must be None (OS entropy), an int or a numpy Generator")


def randomized_response(y, epsilon, seed=None):
    """Binary randomized response: flip each label in {-1, +1} with probability 1/(1+e^ε).

    Parameters
    ----------
    y : array (N,) of {-1, +1} (or {0, 1})
        The true labels; the output uses the same two values.
    epsilon : float > 0
        Label-DP epsilon of the release (pure, δ = 0).
    seed : None, int or numpy Generator, default=None
        None draws from OS entropy (the default: nobody can recompute the flips).

    Returns
    -------
    ndarray (N,)
        The privatized labels.
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D binary labels for randomized response; got shape {y.shape}")
    vals = set(np.unique(y).tolist())
    if not (vals <= {-1, 1} or vals <= {0, 1}):
        raise ValueError(f"label_epsilon needs binary labels in {{-1, +1}} or {{0, 1}}; got values "
                         f"{sorted(vals)[:10]}. Randomized response here is binary only")
    p = flip_probability(epsilon)
    u = np.asarray(_generator(seed).random(y.shape[0]), dtype=float)
    flip = u < p                                    # independent of y: the only randomness
    lo = 0 if 0 in vals else -1
    return np.where(flip, np.where(y == 1, lo, 1), y).astype(y.dtype)


def label_dp_event(epsilon):
    """The dp-accounting event of binary randomized response with flip probability 1/(1+e^ε).

    dp-accounting's RR outputs a uniformly random bucket with probability ``noise_parameter``
    (so it flips a binary label with probability noise_parameter / 2)."""
    import dp_accounting

    return dp_accounting.RandomizedResponseDpEvent(noise_parameter=2.0 * flip_probability(epsilon),
                                                   num_buckets=2)


def label_epsilon_spent(epsilon, delta=0.0) -> float:
    """ε of the label release, answered by dp-accounting's PLD accountant (REPLACE_ONE)."""
    import dp_accounting
    from dp_accounting import pld

    acc = pld.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
                            value_discretization_interval=1e-5)
    acc.compose(label_dp_event(epsilon))
    return float(acc.get_epsilon(delta))


@dataclass
class LabelPrivacy:
    """The label owner's label-DP setting and its ledger (one release: the privatized labels).

    Parameters
    ----------
    epsilon : float
        Label-DP ε (> 0; ``inf`` or 0 = off, see :func:`check_label_epsilon`).
    seed : None, int or numpy Generator, default=None
        Source of the flips; None = OS entropy. Never reported.
    """

    epsilon: float
    seed: object = None
    entries: list = field(default_factory=list)
    seeded: bool = False

    def __post_init__(self):
        self.seeded = self.seeded or self.seed is not None
        eps = check_label_epsilon(self.epsilon)
        if eps is None:
            raise ValueError(f"label_epsilon={self.epsilon!r} means no label privacy; "
                             "build LabelPrivacy only for a finite epsilon > 0")
        self.epsilon = eps

    def __getstate__(self):
        # a pickled model never carries the seed: with it, a party that saw the signs of its
        # duals (-t~) could undo the flips
        state = dict(self.__dict__)
        state["seed"] = None
        return state

    @property
    def flip_probability(self) -> float:
        return flip_probability(self.epsilon)

    def privatize(self, y) -> np.ndarray:
        """Randomized response on ``y``, once: a second call is refused (it would be a
        second release of the same labels, with its own cost)."""
        if self.entries:
            raise RuntimeError("the labels were already privatized once for this run; reuse the "
                               "privatized labels (a second draw would be a second release)")
        out = randomized_response(y, self.epsilon, self.seed)
        self.entries.append({"release": "training labels", "mechanism": "randomized response",
                             "labels": int(np.asarray(y).shape[0]),
                             "flip_probability": self.flip_probability})
        return out

    def spent(self) -> float:
        """ε spent so far, from dp-accounting (0 before the release)."""
        return label_epsilon_spent(self.epsilon) if self.entries else 0.0

    def report(self) -> dict:
        """The label owner's ledger entry for the run report (no seed, no labels)."""
        return {
            "party_id": "label owner",
            "mechanism": "randomized response on the training labels, once before training",
            "config": {"label_epsilon": self.epsilon,
                       "noise_source": "seed (kept by the label owner)" if self.seeded else "os-entropy"},
            "neighbouring_relation": NEIGHBOURING_RELATION,
            "protects": "each training label (pure epsilon-label-DP); every dual y, z, intercept "
                        "and model is post-processing of the privatized labels",
            "does_not_protect": "features (each feature party protects its own, if private); "
                                "test labels (used only by the label owner for metrics)",
            "ledger": {"entries": list(self.entries)},
            "totals": {"pld": self.spent(), "delta": 0.0},
        }


def privatize_labels(loss, y, label_epsilon, seed=None):
    """The label owner's step before training, shared by the engine and the Flower strategy.

    Returns ``(loss, y, label_privacy)``: unchanged with ``label_privacy=None`` when
    ``label_epsilon`` is None, 0 or inf; otherwise the randomized-response labels, the
    forward-corrected logistic loss for their flip probability, and the :class:`LabelPrivacy`
    holding the ledger entry. Only ``loss='logistic'`` (binary labels) is supported.
    """
    eps = check_label_epsilon(label_epsilon)
    if eps is None:
        return loss, y, None
    if getattr(loss, "name", loss) != "logistic":
        raise ValueError(f"label_epsilon={label_epsilon!r} needs loss='logistic' (binary labels, "
                         f"randomized response with a corrected logistic loss); got "
                         f"loss={getattr(loss, 'name', loss)!r}. Set label_epsilon=0 for other losses")
    from flower_vfl.core.label_noise import ForwardCorrectedLogistic

    lp = LabelPrivacy(eps, seed)
    return ForwardCorrectedLogistic(lp.flip_probability), lp.privatize(y), lp
