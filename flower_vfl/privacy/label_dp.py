"""Label differential privacy for the label owner (the central node): randomized response.

The label owner privatizes its training labels **once, before training**: each binary label
is kept with probability e^ε / (1 + e^ε) and flipped otherwise (Warner's randomized response).
Changing one training label changes the probability of any output vector by at most e^ε, so
the privatized labels are ε-label-DP (pure, δ = 0) under the "replace one training label"
relation. Training then uses only the privatized labels (with the forward-corrected loss of
:mod:`flower_vfl.core.label_noise`), so every dual y a party ever receives, every z, the
intercept and the model are post-processing of them: no further label-privacy cost.

Labels are spent once: with a :class:`LabelStore` (``<state-dir>/label-store.sqlite``, the
label owner's own disk) the flips are drawn once per label source (its file, or the bundled
dataset's name: :func:`label_source`) and per ID of that source, stored, and reused in every
later run, whatever rows a run aligns and in whatever order (post-processing: no further cost).
Fresh flips every run would compose: 15 runs at ε = 1 let a party take a majority vote.
A run at another ε on the same source is refused (:class:`LabelBudgetError`), see
:meth:`LabelStore.draw`. :func:`label_ledger_rows` is the label ledger (``flower-vfl ledger``).

The ε reported is answered by dp-accounting (``RandomizedResponseDpEvent`` under a
``REPLACE_ONE`` PLD accountant) for the mechanism actually run, never a constant of this code.
No Flower imports here.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flower_vfl.core.losses import loss_class
from flower_vfl.errors import UserError

__all__ = ["LabelPrivacy", "flip_probability", "randomized_response", "label_dp_event",
           "label_epsilon_spent", "check_label_epsilon", "privatize_labels", "LabelSource", "label_source",
           "LabelStore", "LabelBudgetError", "label_ledger_rows"]

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


def _binary_labels(y) -> tuple[np.ndarray, set]:
    """``(y, its values)`` for 1-D binary labels ({-1, +1} or {0, 1}), or a ValueError saying why not."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D binary labels for randomized response; got shape {y.shape}")
    vals = set(np.unique(y).tolist())
    if not (vals <= {-1, 1} or vals <= {0, 1}):
        raise ValueError(f"label_epsilon needs binary labels in {{-1, +1}} or {{0, 1}}; got values "
                         f"{sorted(vals)[:10]}. Randomized response here is binary only")
    return y, vals


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
    y, vals = _binary_labels(y)
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

    def privatize(self, y, store=None, source=None) -> np.ndarray:
        """Randomized response on ``y``, once: a second call is refused (it would be a
        second release of the same labels, with its own cost). With a ``store`` and a
        ``source`` (:class:`LabelSource`) the flips of IDs drawn in an earlier run are reused
        and only new IDs are drawn (:meth:`LabelStore.draw`)."""
        if self.entries:
            raise RuntimeError("the labels were already privatized once for this run; reuse the "
                               "privatized labels (a second draw would be a second release)")
        entry = {"release": "training labels", "mechanism": "randomized response",
                 "labels": int(np.asarray(y).shape[0]), "flip_probability": self.flip_probability}
        if store is None:
            out = randomized_response(y, self.epsilon, self.seed)
        else:
            out, info = store.draw(source, y, self.epsilon, self.seed)
            entry.update(info)
        self.entries.append(entry)
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


def privatize_labels(loss, y, label_epsilon, seed=None, store=None, source=None):
    """The label owner's step before training, shared by the engine and the Flower strategy.

    Returns ``(loss, y, label_privacy)``: unchanged with ``label_privacy=None`` when
    ``label_epsilon`` is None, 0 or inf; otherwise the randomized-response labels, the
    forward-corrected logistic loss for their flip probability, and the :class:`LabelPrivacy`
    holding the ledger entry. Only ``loss='logistic'`` (binary labels) is supported.

    ``source`` (a :class:`LabelSource`, :func:`label_source`): where ``y`` comes from, and the ID
    of each of its rows; then the labels are drawn once per source and ID and reused in every
    later run, in the label owner's :class:`LabelStore` (``store``: a store, a folder, or None
    for :func:`flower_vfl.privacy.store.default_state_dir`). Without a source (the in-process
    engine on arrays) every call draws afresh.
    """
    eps = check_label_epsilon(label_epsilon)
    if eps is None:
        return loss, y, None
    if not getattr(loss_class(loss), "supports_label_dp", False):
        raise ValueError(f"label_epsilon={label_epsilon!r} needs loss='logistic' (binary labels, "
                         f"randomized response with a corrected logistic loss); got "
                         f"loss={getattr(loss, 'name', loss)!r}. Set label_epsilon=0 for other losses")
    from flower_vfl.core.label_noise import ForwardCorrectedLogistic

    lp = LabelPrivacy(eps, seed)
    if source is not None and not isinstance(store, LabelStore):
        store = LabelStore(store)
    elif source is None and store is not None:
        raise ValueError("privatize_labels: a label store needs source= (label_source(...): the labels file "
                         "or bundled dataset, and the ID of each row of y)")
    return ForwardCorrectedLogistic(lp.flip_probability), lp.privatize(y, store, source), lp


# --------------------------------------------------------------- labels spent once, on disk
class LabelBudgetError(UserError, RuntimeError):
    """A second release of labels that were already drawn once (another ε on the same source)."""


@dataclass(frozen=True)
class LabelSource:
    """A label source and the ID of each row of the labels at hand.

    ``name`` identifies the individuals, not a view of them: the labels file (resolved path,
    ID and label column) or the bundled dataset's name. ``ids``: the source's ID of each row
    of ``y`` (None: ``y`` is the whole source in its own order, row i has ID ``str(i)``)."""

    name: str
    ids: tuple | None = None

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.name.encode("utf-8")).hexdigest()

    def row_ids(self, n: int) -> list[str]:
        if self.ids is None:
            return [str(i) for i in range(n)]
        if len(self.ids) != n:
            raise ValueError(f"label source {self.name}: {len(self.ids)} IDs for {n} labels; give one ID per row")
        return list(self.ids)


def label_source(path: str | None = None, dataset: str | None = None, id_column: str = "id",
                 label_column: str = "label", ids=None) -> LabelSource:
    """The label source of a labels file (``labels-path`` with its ID and label column) or of a
    bundled dataset (``dataset``); ``ids``: the file's ID of each row of the labels at hand
    (e.g. the label owner's IDs in the PSI order). Row order and subsets do not change it."""
    if bool(path) == bool(dataset):
        raise ValueError("label_source: give exactly one of path= (the labels file) or dataset= (a bundled set)")
    if path:
        name = f"file:{Path(str(path)).expanduser().resolve()}#id={id_column}#label={label_column}"
    else:
        name = f"bundled:{dataset}"
    return LabelSource(name, None if ids is None else tuple(str(v) for v in np.asarray(ids).tolist()))


_STORE_SCHEMA = """
CREATE TABLE IF NOT EXISTS sources (source TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, epsilon REAL NOT NULL,
                                    flip_probability REAL NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS draws (source TEXT NOT NULL, id TEXT NOT NULL, positive INTEGER NOT NULL,
                                  flip INTEGER NOT NULL, PRIMARY KEY (source, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS uses (id INTEGER PRIMARY KEY, time REAL NOT NULL, source TEXT NOT NULL,
                                 epsilon REAL NOT NULL, n_rows INTEGER NOT NULL, n_drawn INTEGER NOT NULL,
                                 n_reused INTEGER NOT NULL);
"""


class LabelStore:
    """The label owner's randomized-response draws, per label source and ID, on its own disk
    (``<state_dir>/label-store.sqlite``; written and synced before the labels are used).

    Parameters
    ----------
    state_dir : str, Path or None
        The label owner's state folder (None: :func:`flower_vfl.privacy.store.default_state_dir`).
    """

    FILE = "label-store.sqlite"

    def __init__(self, state_dir=None, check: bool = True):
        from flower_vfl.privacy.store import CountJournal, default_state_dir, disk_errors, open_journaled
        if state_dir is None:
            state_dir = default_state_dir()
        folder = Path(state_dir)
        with disk_errors(folder, "create the label owner's state-dir"):
            folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / self.FILE
        # a deleted or older label-store.sqlite would draw the labels again: loud, as the ledger
        self._journal = CountJournal(self.path, "draws", "label owner's label store")
        self._db = open_journaled(self.path, self._journal, _STORE_SCHEMA, "label store", check)

    def close(self):
        self._db.close()

    def draw(self, source: LabelSource, y, epsilon: float, seed=None) -> tuple[np.ndarray, dict]:
        """The privatized labels of ``y`` (rows named by ``source``): the stored flip of every ID
        drawn before, a fresh flip (probability 1/(1+e^ε)) for every new ID, stored first.

        Refused (:class:`LabelBudgetError`, nothing stored): another ε than the source's first
        draw (its labels are spent: a second draw at any ε composes with the first, and a
        party seeing both could vote), or an ID whose true label changed since its draw."""
        if not isinstance(source, LabelSource):
            raise ValueError(f"source={source!r}: give a LabelSource (flower_vfl.privacy.label_dp.label_source)")
        y, vals = _binary_labels(y)
        eps = check_label_epsilon(epsilon, "epsilon")
        if eps is None:
            raise ValueError(f"epsilon={epsilon!r}: the label store keeps finite-ε draws only")
        ids = source.row_ids(y.shape[0])
        if len(set(ids)) != len(ids):
            raise ValueError(f"label source {source.name}: {len(ids) - len(set(ids))} duplicated row ID(s); "
                             "each label is one individual's")
        positive = (y == 1).astype(np.int64)
        p = flip_probability(eps)
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT epsilon, created FROM sources WHERE source=?", (source.name,)).fetchone()
            if row is not None and row[0] != eps:
                n_old = db.execute("SELECT count(*) FROM draws WHERE source=?", (source.name,)).fetchone()[0]
                raise LabelBudgetError(
                    f"label source {source.name}: its labels were drawn once at label-epsilon={row[0]:g} "
                    f"({n_old} labels, {time.strftime('%Y-%m-%d %H:%M', time.localtime(row[1]))}) and are reused in "
                    f"every run; label-epsilon={eps:g} would be a second release of the same labels (the two "
                    f"draws compose). Set label-epsilon={row[0]:g}: the stored labels are reused at no further cost "
                    "(flower-vfl ledger shows the label ledger)")
            if row is None:
                db.execute("INSERT INTO sources VALUES (?, ?, ?, ?, ?)",
                           (source.name, source.fingerprint, eps, p, time.time()))
            stored = dict(((i, (pos, fl)) for i, pos, fl in
                           db.execute("SELECT id, positive, flip FROM draws WHERE source=?", (source.name,))))
            flip = np.zeros(len(ids), dtype=bool)
            new = []
            changed = []
            for k, i in enumerate(ids):
                got = stored.get(i)
                if got is None:
                    new.append(k)
                else:
                    if got[0] != positive[k]:
                        changed.append(i)
                    flip[k] = bool(got[1])
            if changed:
                raise LabelBudgetError(
                    f"label source {source.name}: the true label of {len(changed)} ID(s) (e.g. {changed[:3]}) "
                    "differs from the one drawn in an earlier run; a new draw would release it again. Keep "
                    "the labels file as it was drawn, or give corrected labels as a new file (a new source)")
            if new:
                u = np.asarray(_generator(seed).random(len(new)), dtype=float)
                flip[new] = u < p                                # independent of y
                db.executemany("INSERT INTO draws VALUES (?, ?, ?, ?)",
                               [(source.name, ids[k], int(positive[k]), int(flip[k])) for k in new])
            db.execute("INSERT INTO uses (time, source, epsilon, n_rows, n_drawn, n_reused) VALUES (?, ?, ?, ?, ?, ?)",
                       (time.time(), source.name, eps, len(ids), len(new), len(ids) - len(new)))
            db.execute("COMMIT")                                 # on disk before any party sees a label
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        if new:
            self._journal.note(db)                               # its count in the journal, then used
        lo = 0 if 0 in vals else -1
        out = np.where(flip, np.where(y == 1, lo, 1), y).astype(y.dtype)
        return out, {"source": source.fingerprint[:16], "drawn": len(new), "reused": len(ids) - len(new)}

    def rows(self) -> list[dict]:
        out = []
        for name, fp, eps, p, created in self._db.execute(
                "SELECT source, fingerprint, epsilon, flip_probability, created FROM sources ORDER BY created"):
            n = self._db.execute("SELECT count(*) FROM draws WHERE source=?", (name,)).fetchone()[0]
            runs, last = self._db.execute("SELECT count(*), max(time) FROM uses WHERE source=?", (name,)).fetchone()
            out.append({"source": name, "fingerprint": fp, "label_epsilon": float(eps), "flip_probability": float(p),
                        "labels_drawn": int(n), "runs": int(runs), "first": float(created),
                        "last": None if last is None else float(last),
                        # one randomized response per label, ever: the accountant's ε of that one release
                        "spent_epsilon": label_epsilon_spent(eps)})
        return out


def label_ledger_rows(state_dir=None) -> list[dict]:
    """The label owner's label ledger (for ``flower-vfl ledger``): per label source, the ε of its
    one draw (from dp-accounting), the labels drawn, the runs that reused them. Empty when the
    folder holds no label store."""
    if state_dir is None:
        from flower_vfl.privacy.store import default_state_dir
        state_dir = default_state_dir()
    if not (Path(state_dir) / LabelStore.FILE).is_file():
        return []
    store = LabelStore(state_dir, check=False)     # shown as it is, even when short of its journal
    try:
        return store.rows()
    finally:
        store.close()
