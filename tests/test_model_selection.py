"""Issue 22 item 9: scikit-learn's model selection with column blocks.

``GridSearchCV(VerticalADMM(), ...).fit([D_1, D_2], y)`` failed inside scikit-learn ("Found input
variables with inconsistent numbers of samples: [2, 426]": the list of blocks read as 2 samples).
:class:`BlockedVerticalADMM` takes one X with declared blocks; each fold's score must equal the
list-of-blocks VerticalADMM fitted on the same rows, and a private party's fits must all charge
one ledger (never a fresh in-memory budget per fit)."""

import re

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_score

from flower_vfl import VerticalADMM
from flower_vfl.estimator.blocked import BlockedVerticalADMM
from flower_vfl.estimator.sklearn_api import column_blocks
from flower_vfl.io.data import labels, party_block
from flower_vfl.privacy import PrivacyConfig
from flower_vfl.privacy.accounting import epsilon_for_releases, noise_multiplier_for
from flower_vfl.privacy.ledger import BudgetExceeded

ROUNDS = 20


@pytest.fixture(scope="module")
def bc():
    blocks = [party_block("breast_cancer", i, 2)[0] for i in range(2)]
    y, _ = labels("breast_cancer")
    return blocks, np.hstack(blocks), y


def _fold_scores(blocks, y, lam, cols=None):
    """The reference: VerticalADMM on the list of blocks, fitted fold by fold (cv=3 on a
    classifier is StratifiedKFold(3) without shuffling)."""
    out = []
    for tr, te in StratifiedKFold(3).split(blocks[0], y):
        m = VerticalADMM(lam=lam, max_rounds=ROUNDS).fit([b[tr] for b in blocks], y[tr])
        out.append(m.score([b[te] for b in blocks], y[te]))
    return out


def test_the_list_of_blocks_is_what_scikit_learn_cannot_split(bc):
    blocks, _, y = bc
    with pytest.raises(ValueError, match=r"inconsistent numbers of samples: \[2, 426\]"):
        cross_val_score(VerticalADMM(max_rounds=3), blocks, y, cv=3, error_score="raise")


def test_cross_val_score_equals_the_list_of_blocks_fold_by_fold(bc):
    blocks, X, y = bc
    scores = cross_val_score(BlockedVerticalADMM(blocks=[15, 15], lam=1e-3, max_rounds=ROUNDS), X, y, cv=3,
                             error_score="raise")
    ref = _fold_scores(blocks, y, 1e-3)
    np.testing.assert_array_equal(scores, ref)
    assert scores.tolist() == pytest.approx([134 / 142, 139 / 142, 140 / 142])


def test_grid_search_chooses_what_a_manual_loop_chooses(bc):
    blocks, X, y = bc
    grid = [1e-4, 1e-2, 1.0]
    search = GridSearchCV(BlockedVerticalADMM(blocks=[range(0, 15), range(15, 30)], max_rounds=ROUNDS),
                          {"lam": grid}, cv=3, error_score="raise").fit(X, y)
    manual = {lam: _fold_scores(blocks, y, lam) for lam in grid}
    for i, lam in enumerate(grid):
        np.testing.assert_array_equal([search.cv_results_[f"split{k}_test_score"][i] for k in range(3)], manual[lam])
    best = max(grid, key=lambda lam: np.mean(manual[lam]))      # max keeps the first of ties, as sklearn's rank
    assert search.best_params_ == {"lam": best} == {"lam": 1e-2}
    assert search.best_score_ == pytest.approx(np.mean(manual[1e-2]))
    # the refit is the full-data fit of the chosen value (to rounding: the blocks' memory layouts differ)
    full = VerticalADMM(lam=best, max_rounds=ROUNDS).fit(blocks, y)
    np.testing.assert_allclose(search.decision_function(X), full.decision_function(blocks), rtol=1e-12, atol=1e-12)


def test_column_selections_any_order_sparse_and_save_load(bc, tmp_path):
    blocks, X, y = bc
    cols = [np.r_[0:10, 20:25], np.r_[10:20, 25:30]]           # not contiguous: each party's own columns
    ref = VerticalADMM(lam=1e-3, max_rounds=ROUNDS).fit([X[:, c] for c in cols], y)
    for spec in (cols, [c.tolist() for c in cols]):
        m = BlockedVerticalADMM(blocks=spec, lam=1e-3, max_rounds=ROUNDS).fit(X, y)
        np.testing.assert_array_equal(m.decision_function(X), ref.decision_function([X[:, c] for c in cols]))
    sparse = BlockedVerticalADMM(blocks=cols, lam=1e-3, max_rounds=ROUNDS).fit(sp.csr_matrix(X), y)
    np.testing.assert_allclose(sparse.decision_function(X), m.decision_function(X), atol=1e-8)
    assert m.score(X, y) == pytest.approx(np.mean(m.predict(X) == y))
    loaded = BlockedVerticalADMM.load(m.save(tmp_path / "m.npz"))
    assert loaded.blocks == [c.tolist() for c in cols]
    np.testing.assert_array_equal(loaded.decision_function(X), m.decision_function(X))
    c = clone(m)
    assert c.get_params()["blocks"] is not m.blocks and not hasattr(c, "coef_")
    assert set(c.get_params()) == set(VerticalADMM().get_params()) | {"blocks", "privacy_ledger", "privacy_budget"}


@pytest.mark.parametrize("spec, n, msg", [
    (None, 30, "blocks=None: declare each party's columns of X, e.g. blocks=[66, 57]"),
    ([15, 14], 30, "blocks=[15, 14] declares widths summing to 29, but X has 30 columns"),
    ([range(0, 16), range(15, 30)], 30, "column 15 is in blocks[0] and blocks[1]; a column belongs to one party"),
    ([range(0, 15), range(16, 30)], 30, "column(s) [15] of X are in no block"),
    ([range(0, 15), range(15, 31)], 30, "blocks[1] selects column 30, but X has columns 0..29"),
    ([15, range(15, 30)], 30, "mixes widths and column selections"),
    ([], 30, "give a non-empty list, one entry per party"),
])
def test_bad_block_declarations_name_the_argument_and_the_fix(spec, n, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        column_blocks(spec, n)


def test_a_bad_declaration_fails_in_fit_before_any_round(bc):
    _, X, y = bc
    with pytest.raises(ValueError, match=re.escape("blocks=[20, 20] declares widths summing to 40")):
        cross_val_score(BlockedVerticalADMM(blocks=[20, 20]), X, y, cv=3, error_score="raise")


def test_a_private_party_without_a_ledger_is_refused_before_any_round(bc):
    _, X, y = bc
    est = BlockedVerticalADMM(blocks=[15, 15], lam=1e-3, max_rounds=ROUNDS,
                              privacy=[None, PrivacyConfig(epsilon=1.0, lam=0.1, seed=0)])
    with pytest.raises(ValueError, match=re.escape(
            "privacy_ledger=None with private party [1]: every fit (each fold, each grid point, the refit) "
            "releases the private blocks again, and an in-memory ledger would start a fresh budget at each fit")):
        cross_val_score(est, X, y, cv=3, error_score="raise")


def test_every_fit_of_a_private_party_charges_one_ledger(bc, tmp_path):
    """Three folds at ε=1 per fit (one released model each: train_rounds=0, eval_rounds=1):
    the ledger holds three releases whose total is the exact accountant's over all three, and
    a budget that covers two fits refuses the third before it releases anything."""
    _, X, y = bc
    cfg = PrivacyConfig(epsilon=1.0, lam=0.1, seed=0)
    z = noise_multiplier_for(1.0, cfg.delta, 1, "exact")
    three = epsilon_for_releases([z] * 3, cfg.delta, "exact")
    two = epsilon_for_releases([z] * 2, cfg.delta, "exact")
    assert 1.0 < two < three < 3.0                 # fits compose: the total is below 3 x ε but above ε
    path = tmp_path / "ledger.sqlite"
    est = BlockedVerticalADMM(blocks=[15, 15], lam=1e-4, max_rounds=ROUNDS, privacy_ledger=str(path),
                              privacy_budget=three, privacy=[None, cfg])
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # PrivatePartyHurts is not what this test checks
        cross_val_score(est, X, y, cv=3, error_score="raise")
        m = clone(est).set_params(privacy_budget=three * (1 + 1e-6))
        with pytest.raises(BudgetExceeded, match=r"party 1 refuses the train release for round 1 .* above the "
                                                 r"budget ε=.*already spent ε=.* over 3 release\(s\)"):
            m.fit(X, y)                            # a fourth fit: refused before its first round
    from flower_vfl.privacy.ledger import Budget, Ledger
    from flower_vfl.privacy.store import PartyStore
    led = Ledger(PartyStore(path), "in-process:1", Budget(three, cfg.delta), 1, note=False)
    assert len(led.entries) == 3 and len({e.run for e in led.entries}) == 3
    assert led.spent() == pytest.approx(three, rel=1e-9)
    # the default budget is the PrivacyConfig's ε, which one fit spends: the second fold is refused
    est2 = clone(est).set_params(privacy_ledger=str(tmp_path / "other.sqlite"), privacy_budget=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(BudgetExceeded, match=r"above the budget ε=1 .* over 1 release\(s\)"):
            cross_val_score(est2, X, y, cv=3, error_score="raise")
