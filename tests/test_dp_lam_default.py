"""A private party's default dp-lam scales with its own N (issue: a default tuned on a9a is not a
default). Before, an unset dp-lam meant the run's lam (1e-4), and the README's dp-lam 3e-3 (what
validation picks on a9a) gave 0.39 cross-validated accuracy on Titanic's 891 rows at ε = 1, below
the majority class. Now dp-lam unset is :func:`flower_vfl.config.settings.default_dp_lam`, from the
party's N and its own plan; the private party then never makes the model worse than the best
non-private party alone (Titanic, 5-fold CV, either party private), and on a9a it loses nothing
against the 3e-3 validated there.

In process (the engine with a seeded PrivacyConfig from the node-config path): the Flower party
builds the same PrivacyConfig from its node config and its aligned rows (apps/client.py)."""

import numpy as np
import pytest

from flower_vfl import VerticalADMM
from flower_vfl.config.settings import DP_SCORE_NOISE, default_dp_lam, privacy_from_config
from flower_vfl.privacy.accounting import noise_multiplier_for
from flower_vfl.privacy.sensitivity import strict_param_sensitivity

TITANIC = "/work/shared/data/titanic/train.csv"


def _node(**kw):
    return {"partition-id": 1, "dp": True, "dp-epsilon": 1.0, **kw}


def test_the_default_gives_the_target_score_noise_at_the_default_rho():
    """Closed form: at rho_x = 0.1 / N (logistic, 2 parties, the default rho) the released model's
    score noise z C_x (unit rows) is DP_SCORE_NOISE, whatever N, ε or the plan."""
    for n, eps, rounds in ((712, 1.0, 0), (32_561, 1.0, 0), (426, 5.0, 3), (100_000, 0.5, 10)):
        cfg = privacy_from_config(1, {}, _node(**{"dp-epsilon": eps, "dp-train-rounds": rounds}), n_rows=n)
        z = noise_multiplier_for(eps, 1e-5, rounds + 1, "exact")
        assert z * strict_param_sensitivity(0.1 / n, cfg.lam, 2.0, 10.0) == pytest.approx(DP_SCORE_NOISE, rel=1e-12)
    # an explicit dp-lam is the party's choice; without its N the Python API's meaning (the run's lam)
    assert privacy_from_config(1, {}, _node(**{"dp-lam": 3e-3}), n_rows=712).lam == 3e-3
    assert privacy_from_config(1, {}, _node()).lam is None
    assert default_dp_lam(712, privacy_from_config(1, {}, _node())) == pytest.approx(0.1048, abs=1e-4)


@pytest.fixture(scope="module")
def titanic():
    pd = pytest.importorskip("pandas")
    df = pd.read_csv(TITANIC)

    def std(v):
        v = np.asarray(v, float)
        v = np.where(np.isnan(v), np.nanmedian(v), v)
        return (v - v.mean()) / v.std()
    a = np.c_[(df["Sex"] == "female").astype(float), *(np.asarray(df["Pclass"] == k, float) for k in (1, 2, 3))]
    b = np.c_[std(df["Age"]), std(df["Siblings/Spouses Aboard"]), std(df["Parents/Children Aboard"]),
              std(np.log1p(df["Fare"]))]
    return [a, b], df["Survived"].to_numpy()


def _cv(blocks, y, fit):
    from sklearn.model_selection import StratifiedKFold
    accs = []
    for tr, te in StratifiedKFold(5, shuffle=True, random_state=0).split(blocks[0], y):
        accs.append(fit([B[tr] for B in blocks], y[tr], [B[te] for B in blocks], y[te]))
    return float(np.mean(accs))


@pytest.mark.parametrize("private", [0, 1])
def test_titanic_at_epsilon_1_is_never_worse_than_the_best_party_alone(titanic, private):
    """891 rows, 2 parties (sex + class | age, family, fare), one private at ε = 1 with every key at
    its default: 5-fold cross-validated accuracy (3 noise seeds, each) at least that of the best
    non-private party alone, less 0.01 (about one standard error of a CV accuracy on 891 rows,
    sqrt(0.8 * 0.2 / 891) = 0.013). Measured (seeds 0, 1, 2): sex + class private 0.713, 0.723,
    0.724 vs 0.704 (age, family, fare alone); age, family, fare private 0.787, 0.778, 0.787 vs 0.787
    (sex + class alone). With dp-lam 3e-3 (the README's, tuned on a9a): 0.633 and 0.640."""
    blocks, y = titanic
    public = 1 - private
    alone = _cv([blocks[public]], y, lambda B, t, Bt, tt: np.mean(VerticalADMM().fit(B, t).predict(Bt) == tt))

    def private_fit(seed, dp_lam=None):
        def fit(B, t, Bt, tt):
            extra = {} if dp_lam is None else {"dp-lam": dp_lam}
            cfg = privacy_from_config(private, {}, _node(**{"partition-id": private, "dp-seed": seed, **extra}),
                                      n_rows=B[private].shape[0])
            pv = [None, None]
            pv[private] = cfg
            return np.mean(VerticalADMM(privacy=pv).fit(B, t).predict(Bt) == tt)
        return fit
    got = [_cv(blocks, y, private_fit(seed)) for seed in range(3)]
    assert min(got) >= alone - 0.01, (got, alone)
    old = np.mean([_cv(blocks, y, private_fit(seed, 3e-3)) for seed in range(3)])
    assert old < alone - 0.05                                  # the a9a-tuned value, for the record


def test_a9a_loses_nothing_against_the_value_validated_there():
    """a9a (32,561 rows, the paper's split), each party private in turn at ε = 1, one noise seed:
    the default (2.3e-3 here) within 0.002 test accuracy of dp-lam 3e-3 (what validation picks on
    a9a). Measured, 3 seeds: 0.8200 vs 0.8197 (party 0 private), 0.8464 vs 0.8465 (party 1)."""
    from flower_vfl.io.data import column_ranges, load_all
    X, y, Xt, yt = load_all("a9a")
    cols = column_ranges("a9a", X.shape[1], 2)
    B = [X[:, a:b].tocsr() for a, b in cols]
    Bt = [Xt[:, a:b].tocsr() for a, b in cols]
    for private in (0, 1):
        acc = {}
        for dp_lam in (None, 3e-3):
            extra = {} if dp_lam is None else {"dp-lam": dp_lam}
            cfg = privacy_from_config(private, {}, _node(**{"partition-id": private, "dp-seed": 0, **extra}),
                                      n_rows=B[private].shape[0])
            pv = [None, None]
            pv[private] = cfg
            acc[dp_lam] = np.mean(VerticalADMM(privacy=pv).fit(B, y).predict(Bt) == yt)
        assert abs(acc[None] - acc[3e-3]) <= 0.002, (private, acc)
