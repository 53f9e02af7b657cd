"""Losses and penalties as registered objects (core/loss_base.py, core/losses.py, core/penalties.py):
what a caller asks of them (``label_kind``, ``multiclass``, ``has_proba``, ``supports_label_dp``,
``supports_private_parties``, a penalty's ``anderson``) agrees with what the object does, and the
callers (the estimator, label DP, the CLI's checks, the accelerator, the private party) refuse by
the attribute, with their messages unchanged."""

import numpy as np
import pytest
from scipy.special import expit

from flower_vfl.core.central import CentralUpdate
from flower_vfl.core.loss_base import Loss
from flower_vfl.core.losses import LOSSES, SoftLabelLogisticLoss, get_loss, loss_class
from flower_vfl.core.penalties import PENALTIES, get_penalty, penalty_class

EVERY_LOSS = sorted(LOSSES) + ["logistic_rr"]


@pytest.mark.parametrize("name", EVERY_LOSS + ["soft"])
def test_each_losss_attributes_say_what_it_does(name):
    loss = SoftLabelLogisticLoss() if name == "soft" else get_loss(name)
    assert loss_class(loss) is type(loss)
    if name != "soft":
        assert loss_class(name) is type(loss)
    # has_proba: the class gives probabilities, rows summing to 1
    assert loss.has_proba == (type(loss).predict_proba is not Loss.predict_proba)
    f = np.linspace(-3, 3, 12)
    if loss.multiclass:
        loss.encode_labels(np.arange(12) % 3)
        f = np.column_stack([f, -f, f / 2])
    if loss.has_proba:
        p = loss.predict_proba(f)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        if not loss.multiclass:
            np.testing.assert_allclose(p[:, 1], expit(f), rtol=1e-12, atol=0)
    else:
        with pytest.raises(AttributeError, match="has no probabilistic output"):
            loss.predict_proba(f)
    # label_kind: what encode_labels takes
    kind = {"logistic": "binary", "hinge": "binary", "sigmoid": "binary", "logistic_rr": "binary",
            "squared": "real", "multinomial": "classes", "soft": "soft"}[name]
    assert loss.label_kind == kind
    assert loss.multiclass == (kind == "classes") == (not loss.supports_private_parties)
    if kind == "binary":
        assert set(np.unique(loss.encode_labels(np.array([0, 1, 1, 0])))) == {-1.0, 1.0}
    elif kind == "real":
        np.testing.assert_array_equal(loss.encode_labels([0.5, 2.5]), [0.5, 2.5])
    elif kind == "soft":
        np.testing.assert_array_equal(loss.encode_labels([0.25, 1.0]), [0.25, 1.0])
    assert loss.supports_label_dp == (name == "logistic")
    assert loss_class("no-such-loss") is None


@pytest.mark.parametrize("name", EVERY_LOSS)
def test_label_dp_refuses_by_the_attribute_with_its_message(name):
    from flower_vfl.privacy.label_dp import privatize_labels
    y = np.array([-1.0, 1.0] * 10)
    if get_loss(name).supports_label_dp:
        loss, _, report = privatize_labels(get_loss(name), y, 1.0, 0)
        assert loss.name == "logistic_rr" and report is not None
        return
    with pytest.raises(ValueError) as err:
        privatize_labels(get_loss(name), y, 1.0, 0)
    assert str(err.value) == (f"label_epsilon=1.0 needs loss='logistic' (binary labels, randomized response with a "
                              f"corrected logistic loss); got loss={name!r}. Set label_epsilon=0 for other losses")


def test_a_private_party_refuses_by_the_attributes_with_its_message():
    from flower_vfl.estimator.engine import VerticalADMM
    from flower_vfl.privacy.party import PrivacyConfig
    rng = np.random.default_rng(0)
    X = [rng.normal(size=(30, 3)), rng.normal(size=(30, 2))]
    for penalty in sorted(PENALTIES):
        assert PENALTIES[penalty].supports_private_parties == (penalty == "l2")
        assert penalty_class(penalty) is penalty_class(get_penalty(penalty)) is PENALTIES[penalty]
    cases = [("logistic", p) for p in sorted(PENALTIES) if p != "l2"] + [("multinomial", "l2")]
    for loss, penalty in cases:
        y = np.arange(30) % (3 if loss == "multinomial" else 2)
        est = VerticalADMM(loss=loss, penalty=penalty, lam=1e-2, max_rounds=2,
                           privacy=[PrivacyConfig(epsilon=1.0, delta=1e-5), None])
        with pytest.raises(ValueError) as err:
            est.fit(X, y)
        assert str(err.value) == ("private parties support penalty='l2' with a scalar-output loss; "
                                  f"got penalty={penalty!r}, loss={loss!r}")


def test_anderson_applies_where_the_penalty_says_so():
    from flower_vfl.core.accel import Anderson, make_accelerator
    central = CentralUpdate(get_loss("logistic"), np.ones(20), 1e-2, theta=0.5)
    for penalty in sorted(PENALTIES):
        for given in (penalty, get_penalty(penalty)):
            acc = make_accelerator("anderson", central, [False, False], given)
            assert isinstance(acc, Anderson) == PENALTIES[penalty].anderson == (penalty == "l2")
    assert penalty_class("no-such-penalty") is None


def test_the_cli_checks_ask_the_registry():
    from flower_vfl.cli.checks import TWO_CLASS_LOSSES, check_label_values
    from flower_vfl.config.schema import ConfigError
    assert TWO_CLASS_LOSSES == ("logistic", "hinge", "sigmoid")
    with pytest.raises(ConfigError) as err:
        check_label_values([0, 1, 2], "hinge", "labels.csv")
    assert str(err.value) == ("labels.csv has 3 label value(s) (0, 1, 2): --loss hinge needs exactly 2 classes; fix "
                              "the file, or give --loss multinomial (more classes) or --loss squared (a number)")
    with pytest.raises(ConfigError) as err:
        check_label_values([1, 1], "multinomial", "labels.csv")
    assert str(err.value) == ("labels.csv has 1 label value (1): --loss multinomial needs at least 2 classes; fix "
                              "the file")
    check_label_values([0, 1, 2], "multinomial", "labels.csv")
    check_label_values([0.5, 1, 2], "squared", "labels.csv")
