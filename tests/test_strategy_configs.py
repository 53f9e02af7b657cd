"""Every central node takes a config object, not a long argument list: each route's central node
has at most 10 constructor parameters; the DP-IADMM server, the vertical SGD label owner and the
moment label owner take their settings as a config checked by the parameter table
(``flower_vfl.config.schema``: ``DPIADMM_PARAMS``, ``SGD_PARAMS``, ``PARAMS``), and the former
keyword names still build it. Each refusal is asserted exactly."""

import dataclasses
import inspect
import re

import numpy as np
import pytest

from flower_vfl import routes
from flower_vfl.config.schema import (DPIADMM_PARAMS, PARAMS, SGD_PARAMS, ParamError, parse_horizontal_run_config,
                                      parse_run_config)
from flower_vfl.errors import UserError
from flower_vfl.horizontal.admm import VARIANTS, DPIADMMParams
from flower_vfl.routes.vertical_sgd.central import VerticalSGDStrategy
from flower_vfl.routes.vertical_sgd.config import SGDConfig
from flower_vfl.routes.vertical_sgd.reference import SCHEDULES
from flower_vfl.strategies.config import MomentConfig
from flower_vfl.strategies.dpiadmm import DPIADMMConfig, DPIADMMStrategy
from flower_vfl.strategies.moment import MomentStrategy

Y = np.array([0, 1, 1, 0, 1, 0, 0, 1])


def test_every_routes_central_node_takes_at_most_ten_parameters():
    counts = {name: len(inspect.signature(r.load("central")).parameters) for name, r in routes.routes().items()}
    assert {"admm", "moment", "stacked-ssp", "horizontal-dpiadmm", "vertical-sgd"} <= set(counts)
    assert {n: c for n, c in counts.items() if c > 10} == {}, counts


REFUSALS = [
    # a bad value
    ("dpiadmm num_agents=0", lambda: DPIADMMStrategy(num_agents=0),
     "DPIADMMStrategy(num_agents=0) is refused: expected an integer >= 1 and <= 10000 (horizontal: number of agents "
     "(one SuperNode each); run config key 'hz-num-agents'); pass num_agents= such a value, e.g. the default "
     "num_agents=10"),
    ("dpiadmm positional variant", lambda: DPIADMMStrategy("obj", 2, 3, 2, 4),
     "DPIADMMStrategy(variant='obj') is refused: expected one of 'objp', 'objt', 'outp' (horizontal DP-IADMM variant "
     "(docs/reproduction-horizontal.md); run config key 'hz-variant'); pass variant= such a value, e.g. the default "
     "variant='objt'"),
    ("dpiadmm num_classes=1", lambda: DPIADMMStrategy("objt", 2, 3, 1, 4),
     "DPIADMMStrategy(num_classes=1) is refused: expected an integer >= 2 (K, the classes of the multiclass logistic "
     "regression); pass num_classes= such a value, e.g. the default num_classes=10"),
    ("dpiadmm eval_every=0", lambda: DPIADMMStrategy(eval_every=0),
     "DPIADMMStrategy(eval_every=0) is refused: expected an integer >= 1 (horizontal: evaluate every k iterations; "
     "run config key 'hz-eval-every'); pass eval_every= such a value, e.g. the default eval_every=10"),
    ("sgd lr_schedule", lambda: VerticalSGDStrategy(Y, lr_schedule="inverted"),
     "VerticalSGDStrategy(lr_schedule='inverted') is refused: expected one of 'constant', 'inverse', 'sqrt' (the step "
     "size over the steps: 'constant' lr, 'inverse' lr/(1 + lr_decay*step), 'sqrt' lr/sqrt(1 + lr_decay*step)); "
     "pass lr_schedule= such a value, e.g. the default lr_schedule='constant'"),
    ("sgd batch_size=0", lambda: VerticalSGDStrategy(Y, batch_size=0),
     "VerticalSGDStrategy(batch_size=0) is refused: expected an integer >= 1 (or None) (rows per SGD step (None: "
     "every row)); pass batch_size= such a value, e.g. the default batch_size=256"),
    ("sgd num_parties=0", lambda: VerticalSGDStrategy(Y, num_parties=0),
     "VerticalSGDStrategy(num_parties=0) is refused: expected an integer >= 1 and <= 1000 (number of column blocks / "
     "parties (one SuperNode each); run config key 'num-parties'); pass num_parties= such a value, e.g. the default "
     "num_parties=2"),
    ("moment tol<0", lambda: MomentStrategy(Y, tol=-1),
     "MomentStrategy(tol=-1) is refused: expected a finite number >= 0 (relative residual tolerance (Boyd 3.3.1); 0 "
     "runs every round; run config key 'tol'); pass tol= such a value, e.g. the default tol=0.0"),
    ("moment lam=0", lambda: MomentStrategy(Y, lam=0),
     "MomentStrategy(lam=0) is refused: the moment route needs a finite lam > 0 (the pool objective must be bounded; "
     "run config key 'lam'); pass lam= such a value, e.g. the default lam=0.0003 (the choice at epsilon = 1)"),
    # a misspelt keyword
    ("dpiadmm trsut", lambda: DPIADMMStrategy("objt", 2, 3, 2, 4, trsut="paper"),
     "DPIADMMStrategy got an unknown setting 'trsut' (did you mean 'trust'?); the settings are the fields of "
     "DPIADMMConfig: variant, num_agents, num_features, num_classes, num_iterations, a, beta, box, c1, c2, Tc, "
     "rho_max, trust, eval_every, timeout, party_wait"),
    ("sgd max_epoch", lambda: VerticalSGDStrategy(Y, max_epoch=3),
     "VerticalSGDStrategy got an unknown setting 'max_epoch' (did you mean 'max_epochs'?); the settings are the "
     "fields of SGDConfig: num_parties, loss, lr, lr_schedule, lr_decay, batch_size, max_epochs, fit_intercept, "
     "init_scale, seed, eval_every, timeout, party_wait"),
    ("moment max_round", lambda: MomentStrategy(Y, max_round=3),
     "MomentStrategy got an unknown setting 'max_round' (did you mean 'max_rounds'?); the settings are the fields "
     "of MomentConfig: num_parties, lam, rho, max_rounds, tol, timeout, party_wait, party_keys, max_release"),
    # what is not a config where the config goes; positional settings given twice or too many
    ("sgd config=3", lambda: VerticalSGDStrategy(Y, None, 3),
     "VerticalSGDStrategy(config=3) is refused: expected a SGDConfig (flower_vfl.routes.vertical_sgd.config) or "
     "None; pass e.g. SGDConfig(num_parties=3, lr=0.05)"),
    ("moment config=3", lambda: MomentStrategy(Y, None, 3),
     "MomentStrategy(config=3) is refused: expected a MomentConfig (flower_vfl.strategies.config) or None; pass e.g. "
     "MomentConfig(num_parties=3, lam=3e-4)"),
    ("dpiadmm twice", lambda: DPIADMMStrategy("objt", 2, num_agents=3),
     "DPIADMMStrategy got the setting 'num_agents' both by position and by name; give it once"),
    ("dpiadmm 14 positional", lambda: DPIADMMStrategy(*DPIADMMConfig.POSITIONAL, 1),
     "DPIADMMStrategy takes at most 13 settings by position (variant, num_agents, num_features, num_classes, "
     "num_iterations, a, beta, box, c1, c2, Tc, rho_max, trust) but got 14; pass the others by name or in a "
     "DPIADMMConfig, e.g. DPIADMMConfig(variant='objt', num_agents=4, num_iterations=50)"),
    ("dpiadmm config then positional", lambda: DPIADMMStrategy(DPIADMMConfig(), 3),
     "DPIADMMStrategy(config=DPIADMMConfig(variant='objt', num_agents=10, num_features=784, num_classes=10, "
     "num_iterations=100, a=1.0, beta=1e-06, box=1.0, c1=2.0, c2=5.0, Tc=10000.0, rho_max=1000000000.0, "
     "trust='paper', eval_every=10, timeout=600.0, party_wait=0.0)) is refused: expected a DPIADMMConfig "
     "(flower_vfl.strategies.dpiadmm) or None; pass e.g. DPIADMMConfig(variant='objt', num_agents=4, "
     "num_iterations=50)"),
]


@pytest.mark.parametrize("what,make,msg", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_each_strategy_refuses_a_bad_setting_at_construction(what, make, msg):
    with pytest.raises(ParamError, match="^" + re.escape(msg) + "$") as err:
        make()
    assert isinstance(err.value, UserError) and isinstance(err.value, ValueError)


def test_a_config_object_and_the_former_arguments_build_the_same_strategy():
    """The config object, the keywords, and (DP-IADMM) the former positional arguments give one
    config; keywords over a config replace its fields and leave the config as it was."""
    cfg = DPIADMMConfig(variant="objp", num_agents=4, num_features=6, num_classes=3, num_iterations=7, beta=1e-4)
    a = DPIADMMStrategy(cfg)
    b = DPIADMMStrategy("objp", 4, 6, 3, 7, beta=1e-4)
    c = DPIADMMStrategy(variant="objp", num_agents=4, num_features=6, num_classes=3, num_iterations=7, beta=1e-4)
    assert a.config == b.config == c.config
    assert (b.num_agents, b.J, b.K, b.T, b.public.variant, b.public.beta) == (4, 6, 3, 7, "objp", 1e-4)
    d = DPIADMMStrategy(cfg, num_agents=5)
    assert (d.num_agents, cfg.num_agents) == (5, 4)

    s = SGDConfig(num_parties=3, lr=0.05, batch_size=3, max_epochs=2)
    sa, sb = VerticalSGDStrategy(Y, None, s), VerticalSGDStrategy(Y, num_parties=3, lr=0.05, batch_size=3, max_epochs=2)
    assert sa.config == sb.config and (sb.num_parties, sb.lr, sb.batch_size, sb.max_epochs) == (3, 0.05, 3, 2)
    assert VerticalSGDStrategy(Y, batch_size=None).batch_size == Y.size      # None: every row
    assert VerticalSGDStrategy(Y, None, s, lr=1).lr == 1.0 and s.lr == 0.05

    m = MomentConfig(num_parties=3, lam=1e-3, rho=0.5, max_rounds=9)
    ma, mb = MomentStrategy(Y, None, m), MomentStrategy(Y, num_parties=3, lam=1e-3, rho=0.5, max_rounds=9)
    assert ma.config == mb.config and (mb.num_parties, mb.lam, mb.rho, mb.max_rounds) == (3, 1e-3, 0.5, 9)
    assert MomentStrategy(Y, rho="auto").rho is None and MomentStrategy(Y, rho=0).rho is None


def test_the_configs_defaults_are_their_tables():
    """Each config's default is its table's, and the tables agree with the code they describe."""
    for cls, table in ((DPIADMMConfig, DPIADMM_PARAMS), (SGDConfig, SGD_PARAMS)):
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        assert set(fields) == set(table), cls
        assert {n: v for n, v in fields.items() if v != table[n].key.default} == {}, cls
    for name in ("num_parties", "max_rounds", "tol", "timeout", "party_wait", "max_release"):
        assert getattr(MomentConfig(), name) == PARAMS[name].key.default, name
    assert SGD_PARAMS["lr_schedule"].key.choices == SCHEDULES
    assert DPIADMM_PARAMS["variant"].key.choices == VARIANTS
    public = DPIADMMParams()
    for name in ("variant", "a", "beta", "box", "c1", "c2", "Tc", "rho_max", "trust"):
        assert getattr(DPIADMMConfig(), name) == getattr(public, name), name


def test_the_configs_from_a_run_config():
    """The ServerApps build the configs from their checked run config."""
    g = parse_horizontal_run_config({"hz-variant": "outp", "hz-num-agents": 3, "hz-iterations": 12, "hz-a": 0.5,
                                     "hz-eval-every": 4})
    cfg = DPIADMMConfig.from_run_config(g, num_features=784, num_classes=10)
    assert cfg == DPIADMMConfig(variant="outp", num_agents=3, num_iterations=12, a=0.5, eval_every=4)
    run = parse_run_config({"route": "moment", "num-parties": 3, "lam": 1e-3, "rho": 0.0, "max-rounds": 9,
                            "round-timeout": 30.0})
    assert MomentConfig.from_run_config(run) == MomentConfig(num_parties=3, lam=1e-3, max_rounds=9, timeout=30.0)
