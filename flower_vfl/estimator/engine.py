"""In-process vertical ADMM sharing with a scikit-learn-style API.

Algorithm 1 run in one process: the rounds are :class:`flower_vfl.core.rounds.RoundDriver`'s,
the Flower strategy's loop, and the parties are the same :class:`PartyUpdate` /
:class:`~flower_vfl.privacy.party.PrivateParty` objects the Flower ClientApp runs, so the two
paths cannot drift.
"""

from __future__ import annotations

import numpy as np

from sklearn.base import BaseEstimator
from sklearn.utils.metaestimators import available_if

from flower_vfl.core.central import CentralUpdate
from flower_vfl.core.constraints import make_constraint  # noqa: F401  (re-exported)
from flower_vfl.core.losses import LOSSES, get_loss
from flower_vfl.core.party import PartyUpdate
from flower_vfl.core.penalties import Ball, Box, get_penalty  # noqa: F401
from flower_vfl.core.rounds import DEFAULT_MAX_ROUNDS, DEFAULT_TOL, DEFAULT_TOL_ABS, RoundDriver, initial_theta
from flower_vfl.core.rounds import sum_releases as _sum_releases  # noqa: F401  (tests)
from flower_vfl.estimator.sklearn_api import SklearnAPIMixin, check_target, decode_scores, encode_classes
from flower_vfl.config.schema import check_params, check_privacy
from flower_vfl.core.validation import check_blocks, check_labels
from flower_vfl.privacy.outcome import PrivatePartyHurts

from flower_vfl.core.schedule import balance_rho, default_rho, private_schedule  # noqa: F401  (re-exported)

__all__ = ["PrivatePartyHurts", "VerticalADMM", "default_rho", "make_constraint", "private_schedule"]


class _InProcess:
    """The engine's :class:`~flower_vfl.core.rounds.RoundExchange`: the party objects called
    in process, with what a Flower party sends (s_m; lam R(x_m) from a non-private party)."""

    evaluates = False      # no test rows: score with decision_function, or in a callback

    def __init__(self, parties, private, central):
        self.parties, self.private, self.central = parties, private, central

    def train(self, k, active, qs):
        c = self.central
        fresh = {m: self.parties[m].train_release(k, c.q if qs is None else qs[m], c.y, c.rho, c.alpha, c.theta)
                 for m in active}
        return fresh, {m: self.parties[m].solver.lam * self.parties[m].penalty_value()
                       for m in active if not self.private[m]}

    def evaluate(self, k, parties, final):  # pragma: no cover - evaluates is False
        raise NotImplementedError

    def finish(self, k):
        """Each private party's last x-update from the last message (internal, never released:
        costs no privacy), then its model x~ drawn and charged once (numbered as in Flower)."""
        c = self.central
        for p, pr in zip(self.parties, self.private):
            if pr:
                p.final_update(c.q, c.y, c.rho, c.alpha, c.theta)
        for p, pr in zip(self.parties, self.private):
            if pr and p.config.eval_rounds > 0:
                p.release_model(k)


def _check_classes(y) -> None:
    """loss='multinomial': class labels (scikit-learn's "Unknown label type" for a continuous y),
    at least two of them."""
    from sklearn.utils.multiclass import type_of_target
    from flower_vfl.core.validation import InputError
    kind = type_of_target(y)
    if kind == "continuous":
        raise InputError("Unknown label type: continuous. loss='multinomial' needs class labels; use loss='squared' "
                         "for a continuous target")
    classes = np.unique(y)
    if classes.size < 2:
        raise InputError(f"y has {classes.size} class ({classes.tolist()[:1]}): loss='multinomial' needs at least 2 "
                         "classes; give rows of every class")


def loss_has_proba(est) -> bool:
    """Whether the estimator's loss gives probabilities (its ``has_proba``: core/loss_base.py)."""
    loss = getattr(est, "loss_", None)
    if loss is None:
        if isinstance(est.loss, str) and est.loss not in LOSSES:
            return True                       # fit refuses the name, naming it
        loss = get_loss(est.loss) if isinstance(est.loss, str) else est.loss
    return bool(getattr(loss, "has_proba", False))


def _public_coef(parties):
    """Model blocks a user may see: x_m of a non-private party, the released x~ of a private
    one (None before its release); the exact private x never leaves the party object."""
    return [p.x_released if hasattr(p, "ledger") else p.x.copy() for p in parties]


class VerticalADMM(SklearnAPIMixin, BaseEstimator):
    """Vertical ADMM sharing (Hu et al., "Learning Privately over Distributed Features").

    Minimizes ``(1/N) sum_i l_i(sum_m D_m^i x_m + b) + lam * sum_m R_m(x_m)``,
    x_m in X_m, with each party's block ``D_m`` used only by that party.

    ``fit`` checks every argument against the one parameter table
    (:data:`flower_vfl.config.schema.PARAMS`: the run config's types and ranges), and the data
    (:mod:`flower_vfl.core.validation`), before any round; an error names the argument or block,
    the bad value, what is accepted and the fix.

    Parameters
    ----------
    loss : {'logistic', 'squared', 'hinge', 'multinomial', 'sigmoid'}, default='logistic'
    penalty : {'l2', 'l1', 'elasticnet', 'none'}, default='l2'
        R = 1/2||x||^2 for 'l2', ||x||_1 for 'l1'.
    lam : float, default=1e-4
    rho : float > 0, 'auto' or 0, default='auto'
        ADMM penalty on the z side; 'auto' (or 0, as the run config's ``rho``) uses :func:`default_rho`.
    fit_intercept : bool, default=True
        The label owner fits an unpenalized intercept jointly with z.
    max_rounds : int, default=50
    tol : float, default=0.0
        Relative tolerance of Boyd's residual stopping rule; 0 runs all rounds (the defaults
        are the run config's, :mod:`flower_vfl.core.rounds`; e.g. ``tol=1e-6`` to stop early).
    tol_abs : float, default=1e-9
    alpha : float, default=1.0
        Over-relaxation (1 = the paper's eq. 7-8 verbatim).
    variant : {'sharing', 'sharing-fixed', 'paper'}, default='sharing'
        'sharing-fixed' damps the residual by 1/M (theta = 1/M, Boyd Sec. 7.3, convergent for
        any rho); 'sharing' starts there and, in plain rounds of an L2 fit without a constraint
        and with every party non-private, raises theta once from the alignment of the parties'
        releases and only lowers it after
        (:meth:`~flower_vfl.core.rounds.RoundDriver.plan`; 1M x 3 sparse: 6 rounds to a gap of
        1e-4 instead of 8); 'paper' uses eq. (6) verbatim (theta = 1).
    adaptive_rho : bool, default=False
        Residual balancing (Boyd Sec. 3.4.1, mu=10, tau=2), after every round that does not stop.
    l1_ratio : float, default=0.5
    constraint : None, ('ball', r) or ('box', lo, hi)
        X_m, applied to every party's block.
    random_state : int or None
        Seed for any randomness (privacy noise); the non-private algorithm is deterministic.
    privacy : None or list of (PrivacyConfig or None)
        Per party: None for a non-private party, or its own
        :class:`flower_vfl.privacy.PrivacyConfig` (then penalty must be 'l2'; rows are
        normalized, x is kept in its ball, releases are noisy and ledgered). The party's model
        x~ is drawn and charged once, after its final update (when its ``eval_rounds`` > 0);
        :meth:`decision_function` scores rows from that released x~ and costs nothing more
        (post-processing).
        With private parties ``max_rounds`` and ``tol`` govern the warm-start phase of the
        non-private parties; each private party then takes part in ``train_rounds`` rounds
        (the smallest over private parties) and makes one final unreleased x-update
        (:func:`private_schedule`).
    verbose : bool, default=False
        Show a progress bar.
    callback : callable(round, engine) or None
        Called after every round (e.g. to record test metrics).
    x_solver : {'auto', 'gram', 'cg', 'dual', 'chol'}, default='auto'
        The parties' x-update method (:mod:`flower_vfl.core.xsolve`); 'auto' chooses by the
        block's shape and logs the choice (logger ``flower_vfl.core``).
    acceleration : {'auto', 'anderson', 'spectral', 'anderson+spectral', 'none'}, default='auto'
        Fewer rounds, same fixed point (:mod:`flower_vfl.core.accel`): type-II Anderson
        acceleration of the round and/or spectral adaptive rho (Xu et al. 2017). 'auto' is
        Anderson where it applies (alpha = 1, no private party, penalty 'l2' without a
        constraint) while its memory is at most 128 MiB (``accel.AUTO_ANDERSON_MAX_BYTES``: about
        (M + 1) N K <= 1.9M, e.g. 480k rows x 3 parties), and 'none' otherwise; the choice is in
        ``acceleration_`` and the Flower strategy runs the same code.
    label_epsilon : float or None, default=None
        Label DP for the label owner (loss='logistic'): the training labels are privatized once
        by randomized response (epsilon-label-DP, pure) and training uses the forward-corrected
        loss (:mod:`flower_vfl.core.label_noise`); every dual y the parties receive is then
        post-processing of the privatized labels. None, 0 or inf: labels not protected.
    label_seed : None, int or numpy Generator, default=None
        Source of the label flips; None draws from OS entropy.
    party_model : None, str, dict or list of them, default=None
        Each party's block model (:mod:`flower_vfl.core.blocks`, docs/party-models.md): 'linear'
        (None: today's block), 'rff', 'spline', 'bins' (data-independent feature maps, rows unit
        norm, the linear block's solvers and privacy unchanged on the mapped rows) or 'nystroem'
        (non-private parties only); a dict gives the kind and its settings as the node-config keys
        (``{"party-model": "rff", "party-model-features": 1024}``); a list gives one per party.
        ``coef_`` holds each party's coefficients on its mapped columns; ``party_models_`` the maps.

    Attributes
    ----------
    coef_ : list of ndarray
    intercept_ : float or ndarray
    history_ : list of dict
        Per round (:class:`~flower_vfl.core.rounds.RoundDriver`, the same rows as the Flower
        strategy's): train_loss (on the released s_m), objective (when no party is private:
        a private party's lam R(x_m) is not released), primal and dual residuals, rho,
        parties, stale, elapsed seconds.
    n_rounds_ : int
    converged_ : bool
    acceleration_ : str
        The acceleration the fit used ('anderson', 'spectral', 'anderson+spectral' or 'none'):
        what ``acceleration`` resolved to (see that parameter).
    """

    def __init__(self, loss="logistic", penalty="l2", lam=1e-4, rho="auto", fit_intercept=True,
                 max_rounds=DEFAULT_MAX_ROUNDS, tol=DEFAULT_TOL, tol_abs=DEFAULT_TOL_ABS, alpha=1.0, variant="sharing",
                 adaptive_rho=False, l1_ratio=0.5, constraint=None, random_state=None,
                 privacy=None, verbose=False, callback=None, x_solver="auto",
                 acceleration="auto", label_epsilon=None, label_seed=None, party_model=None):
        self.loss = loss
        self.penalty = penalty
        self.lam = lam
        self.rho = rho
        self.fit_intercept = fit_intercept
        self.max_rounds = max_rounds
        self.tol = tol
        self.tol_abs = tol_abs
        self.alpha = alpha
        self.variant = variant
        self.adaptive_rho = adaptive_rho
        self.l1_ratio = l1_ratio
        self.constraint = constraint
        self.random_state = random_state
        self.privacy = privacy
        self.verbose = verbose
        self.callback = callback
        self.x_solver = x_solver
        self.acceleration = acceleration
        self.label_epsilon = label_epsilon
        self.label_seed = label_seed
        self.party_model = party_model

    # ------------------------------------------------------------------ fit
    def _setup(self, X_blocks, y):
        # every argument the parameter table declares (config/schema.py, PARAMS), before any work
        check_params(type(self).__name__, self.get_params(deep=False))
        loss = get_loss(self.loss)
        if isinstance(self.loss, str):
            loss = get_loss(self.loss)  # fresh instance: multinomial stores classes_
        y = check_labels(check_target(y, type(self).__name__), loss=loss.name)
        if loss.multiclass:
            _check_classes(y)
        blocks = check_blocks(X_blocks, n_rows=y.shape[0])
        check_privacy(type(self).__name__, self.privacy, len(blocks))
        # each party's block model (core/blocks.py): a feature map is applied once, here; 'linear'
        # keeps the very same block object (bitwise trajectories)
        from flower_vfl.core.blocks import map_blocks, resolve_party_models
        self._raw_widths = [D.shape[1] for D in blocks]
        self.party_models_ = resolve_party_models(
            getattr(self, "party_model", None), len(blocks),
            [cfg is not None for cfg in (self.privacy or [None] * len(blocks))], type(self).__name__)
        blocks = map_blocks(self.party_models_, blocks)
        self._binary_classes = None
        if loss.label_kind == "binary":     # any two labels; classes_[1] is the positive class
            y, self._binary_classes = encode_classes(y, loss.name)   # kept for fit (one pass less)
        # label DP: randomized response once, then the corrected loss (privacy/label_dp.py)
        from flower_vfl.privacy.label_dp import privatize_labels
        loss, y, self.label_privacy_ = privatize_labels(loss, y, getattr(self, "label_epsilon", None),
                                                        getattr(self, "label_seed", None))
        t = loss.encode_labels(y)
        penalty = get_penalty(self.penalty, self.l1_ratio)
        if penalty.smooth_quadratic and self.lam == 0 and self.constraint is None:
            pass  # the direct solver reports a singular system if D_m is rank-deficient
        n = t.shape[0]
        rho = default_rho(loss, n, penalty) if self.rho in (None, "auto", 0) else float(self.rho)
        M = len(blocks)
        theta = initial_theta(self.variant, M)
        constraint = make_constraint(self.constraint)
        parties = self._make_parties(blocks, penalty, constraint, loss)
        central = CentralUpdate(loss, t, rho, alpha=self.alpha, theta=theta,
                                fit_intercept=self.fit_intercept)
        return loss, blocks, t, parties, central

    def _make_parties(self, blocks, penalty, constraint, loss):
        privacy = self.privacy if self.privacy is not None else [None] * len(blocks)
        if len(privacy) != len(blocks):
            raise ValueError(f"privacy has {len(privacy)} entries but there are {len(blocks)} blocks; "
                             "give one PrivacyConfig (or None) per party")
        parties = []
        models = getattr(self, "party_models_", None) or [None] * len(blocks)
        for m, (D, cfg) in enumerate(zip(blocks, privacy)):
            if cfg is None and hasattr(models[m], "make_update"):     # a network block (core/blocks_mlp.py)
                parties.append(models[m].make_update(D, self.lam, loss.n_outputs))
                continue
            if cfg is None:
                parties.append(PartyUpdate(D, penalty, self.lam, constraint, n_outputs=loss.n_outputs,
                                           x_solver=getattr(self, "x_solver", "auto"),
                                           center=bool(self.fit_intercept)))
                continue
            from flower_vfl.privacy.party import PrivateParty
            if not (penalty.supports_private_parties and loss.supports_private_parties):
                raise ValueError("private parties support penalty='l2' with a scalar-output loss; "
                                 f"got penalty={penalty.name!r}, loss={loss.name!r}")
            if cfg.seed is None and self.random_state is not None:
                import dataclasses
                cfg = dataclasses.replace(cfg, seed=int(self.random_state) * 1000 + m)
            parties.append(PrivateParty(D, None, self.lam, cfg, party_id=m, n_parties=len(blocks)))
        return parties

    def fit(self, X_blocks, y):
        """Run ADMM sharing until the residual rule holds or ``max_rounds`` are done.

        The rounds are :class:`~flower_vfl.core.rounds.RoundDriver`'s, the Flower strategy's
        loop, with the parties called in process. With private parties the run has the phases
        of :func:`private_schedule`: the non-private parties (and the intercept) first, then
        the private parties' budgeted rounds, then one unreleased x-update of each private
        party, used by its evaluation releases.
        """
        loss, blocks, t, parties, central = self._setup(X_blocks, y)
        self._parties, self._central, self._eval_round = parties, central, 0
        self.loss_, self.n_features_in_ = loss, list(self.__dict__.pop("_raw_widths", [D.shape[1] for D in blocks]))
        self.block_widths_ = list(self.n_features_in_)
        classes = self.__dict__.pop("_binary_classes", None)
        # the user's own labels (None: regression)
        self.classes_ = classes if classes is not None else encode_classes(y, loss.name)[1]
        private = [hasattr(p, "ledger") for p in parties]
        driver = RoundDriver(central, len(parties), max_rounds=self.max_rounds, tol=self.tol,
                             tol_abs=self.tol_abs, adaptive_rho=self.adaptive_rho)
        phases = driver.plan(private, [p.config.train_rounds for p, pr in zip(parties, private) if pr],
                             getattr(self, "acceleration", "none"), self.penalty, self.constraint is not None,
                             adapt_theta=self.variant == "sharing")
        self.acceleration_ = driver.acceleration
        if driver.acc is None:      # plain rounds: looser inner forcing, CG for tall sparse L2 blocks
            for p, pr in zip(parties, private):
                if not pr:
                    p.plain_rounds()     # as a non-private Flower party told so (clients/party_public.py)
        self.history_ = driver.history
        self.converged_ = False
        bar = None
        if self.verbose:
            from tqdm.auto import tqdm
            bar = tqdm(total=sum(r for r, _, _ in phases), desc="ADMM rounds", unit="round")

        def on_round(k, row, i_phase, j, stopped):
            if self.callback is not None:   # copies of x (x is updated in place): for it only
                self.coef_ = _public_coef(parties)
            self.intercept_ = central.b.copy() if np.ndim(central.b) else float(central.b)
            self.n_rounds_ = k
            if bar is not None:
                bar.update(1)
                bar.set_postfix(objective=f"{row.get('objective', row['train_loss']):.6g}",
                                r=f"{row['primal_residual']:.2e}")
            if self.callback is not None:
                self.callback(k, self)

        def on_warm_start(k, metrics):   # the non-private parties' model alone: the bar to clear
            self.nonprivate_coef_ = [None if pr else p.x.copy() for p, pr in zip(parties, private)]
            self.nonprivate_intercept_ = central.b.copy() if np.ndim(central.b) else float(central.b)

        try:
            driver.run(_InProcess(parties, private, central), on_round=on_round, on_warm_start=on_warm_start)
        finally:     # also when a round raises or the fit is interrupted: the parties' blocks as they are
            self.coef_ = _public_coef(parties)
            self.converged_ = driver.converged
            if bar is not None:
                bar.close()
        self.dp_warning_ = self._warn_if_private_hurts(blocks, t, parties, private, central)
        return self

    def _warn_if_private_hurts(self, blocks, t, parties, private, central):
        """Warn (:class:`PrivatePartyHurts`) when the private parties' released noise alone,
        whatever their columns, is expected to make the training loss worse than the non-private
        parties' warm-start model: the check of the Flower path and ``flower-vfl fit``
        (:func:`~flower_vfl.privacy.outcome.dp_hurts_message`), on training rows from released
        values only (:func:`~flower_vfl.privacy.outcome.noise_loss_bound`): no test label, and no
        private party's row or score."""
        if getattr(self, "nonprivate_coef_", None) is None or not all(
                p.x_released is not None for p, pr in zip(parties, private) if pr):
            return None
        from flower_vfl.privacy.outcome import FIX_API, dp_hurts_message, noise_loss_bound
        b = central.b.copy() if np.ndim(central.b) else float(central.b)
        f_public = sum((D @ p.x for D, p, pr in zip(blocks, parties, private) if not pr), np.zeros(t.shape[0])) + b
        f_ref = sum((D @ x for D, x in zip(blocks, self.nonprivate_coef_) if x is not None),
                    np.zeros(t.shape[0])) + self.nonprivate_intercept_
        sigma = [p.z * p.sensitivity(p.update.rho_x, 1.0, "eval") for p, pr in zip(parties, private) if pr]
        reach = [p.config.b1 for p, pr in zip(parties, private) if pr]
        msg = dp_hurts_message(noise_loss_bound(self.loss_, f_public, t, sigma, reach), self.loss_.mean(f_ref, t),
                               measured="training loss expected at best from their released noise", fix=FIX_API)
        if msg:
            import warnings
            warnings.warn(msg, PrivatePartyHurts, stacklevel=3)
        return msg

    def privacy_report(self):
        """Per private party: config, neighbouring relation, noise multiplier, ledger, totals;
        then the label owner's label-DP entry when ``label_epsilon`` was set."""
        reports = [p.report() for p in getattr(self, "_parties", []) if hasattr(p, "report")]
        if getattr(self, "label_privacy_", None) is not None:
            reports.append(self.label_privacy_.report())
        return reports

    # ------------------------------------------------------------- predict
    def decision_function(self, X_blocks):
        if not hasattr(self, "coef_"):
            from sklearn.exceptions import NotFittedError      # an AttributeError and a ValueError
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit(X_blocks, y) first")
        blocks = check_blocks(X_blocks)
        widths = getattr(self, "block_widths_", self.n_features_in_)
        if [D.shape[1] for D in blocks] != list(widths):
            raise ValueError(f"blocks have widths {[D.shape[1] for D in blocks]}; the model was fitted "
                             f"on widths {list(widths)}")
        mapped = self._party_features(blocks)
        from flower_vfl.core.blocks import block_scores
        f = block_scores(getattr(self, "party_models_", None), mapped, self.coef_)   # a network block's forward
        return self._released_decision(mapped) if f is None else f + self.intercept_

    def _party_features(self, blocks):
        """Each party's rows through its block model's map (``party_models_``; after :meth:`load`
        rebuilt from ``party_model`` and the column counts: the maps are data-independent)."""
        models = getattr(self, "party_models_", None)
        if models is None and getattr(self, "party_model", None) not in (None, "linear"):
            from flower_vfl.core.blocks import block_from_meta, resolve_party_models
            kinds = resolve_party_models(self.party_model, len(blocks), owner=type(self).__name__)
            models = self.party_models_ = [block_from_meta({**k.to_meta(), "d_in": w})
                                           for k, w in zip(kinds, self.n_features_in_)]
        return blocks if models is None else [m.features(D) for m, D in zip(models, blocks)]

    def save(self, path):
        """:meth:`SklearnAPIMixin.save`, with each party's block kind and settings (``party_models``:
        ``PartyBlock.to_meta()``, never a row); a block model fitted on a party's rows ('nystroem') is
        refused by name (the file would hold rows)."""
        models = getattr(self, "party_models_", None)
        if not models:
            return super().save(path)
        metas = [model.to_meta() for model in models]
        from flower_vfl.estimator.sklearn_api import estimator_meta
        from flower_vfl.io.model_files import write_model_file
        if not hasattr(self, "coef_"):
            raise AttributeError("this VerticalADMM is not fitted yet; call fit(X_blocks, y) before save")
        arrays, meta = estimator_meta(self)
        return write_model_file(path, arrays, {**meta, "party_models": metas})

    @classmethod
    def load(cls, path):
        """:meth:`SklearnAPIMixin.load`; each party's block model rebuilt from its saved kind and
        settings (a network's outputs included), so new rows are mapped as in training."""
        est = super().load(path)
        from flower_vfl.io.model_files import load_model
        metas = load_model(path)["meta"].get("party_models")
        if metas:
            from flower_vfl.core.blocks import block_from_meta
            est.party_models_ = [block_from_meta(b) for b in metas]
        return est

    def decision_function_nonprivate(self, X_blocks):
        """Scores of the non-private parties' model at the end of the warm start (private runs):
        the bar the private parties must clear (``flower-vfl fit`` warns when they do not)."""
        if getattr(self, "nonprivate_coef_", None) is None:
            raise AttributeError("no private parties in this fit: there is no non-private reference")
        blocks = self._party_features(check_blocks(X_blocks))
        return sum(D @ x for D, x in zip(blocks, self.nonprivate_coef_) if x is not None) + \
            self.nonprivate_intercept_

    def predict(self, X_blocks):
        """Labels in the encoding of the ``y`` given to fit (``classes_``); values for 'squared'."""
        f = self.decision_function(X_blocks)
        return decode_scores(f, self.loss_, self.classes_)[0] if self.classes_ is not None else f

    @available_if(loss_has_proba)
    def predict_proba(self, X_blocks):
        """Class probabilities (losses with them: 'logistic', 'multinomial'; for the others the
        method is absent, as scikit-learn's ``hasattr(est, 'predict_proba')`` expects)."""
        f = self.decision_function(X_blocks)
        return self.loss_.predict_proba(f)

    def objective(self, X_blocks, y):
        """The objective (1/N) sum l + lam sum R at the fitted coefficients."""
        y = np.asarray(y)
        if self.loss_.label_kind == "binary":
            y = np.where(y == self.classes_[1], 1.0, -1.0)
        t = self.loss_.encode_labels(y) if not self.loss_.multiclass else type(self.loss_)().encode_labels(y)
        f = self.decision_function(X_blocks)
        pen = get_penalty(self.penalty, self.l1_ratio)
        return self.loss_.mean(f, t) + self.lam * sum(pen.value(x) for x in self.coef_)
