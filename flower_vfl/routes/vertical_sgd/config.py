"""The settings of the vertical SGD baseline's label owner, one object checked by the parameter table.

:class:`SGDConfig` holds what :class:`~flower_vfl.routes.vertical_sgd.central.VerticalSGDStrategy`
used to take as 13 separate arguments; each is checked, when the object is made, against
:data:`flower_vfl.config.schema.SGD_PARAMS` (the vertical run config's declaration where one shares
the meaning: ``num_parties``, ``loss``, ``fit_intercept``, ``timeout``), so a bad value is refused
before any message is sent, naming the argument, the value, the accepted range and the fix.

    config = SGDConfig(num_parties=3, lr=0.05, max_epochs=5)
    strategy = VerticalSGDStrategy(y_train, y_test, config)
    # or, as before, the same names as keywords:
    strategy = VerticalSGDStrategy(y_train, y_test, num_parties=3, lr=0.05, max_epochs=5)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from flower_vfl.config.schema import SGD_PARAMS, check_params
from flower_vfl.strategies.config import build_config

__all__ = ["SGDConfig"]


@dataclass(frozen=True)
class SGDConfig:
    """Settings of the label owner of vertical SGD.

    Parameters
    ----------
    num_parties : int, default=2
    loss : str or Loss, default='logistic'
    lr, lr_schedule, lr_decay, batch_size, max_epochs, fit_intercept, init_scale, seed :
        As :class:`~flower_vfl.routes.vertical_sgd.reference.VerticalSGD` (``seed`` = its
        ``random_state``; ``batch_size`` None: every row); ``init_scale`` and ``seed`` are sent to
        the parties, which draw their own x_m.
    eval_every : int >= 0, default=1
        Evaluate (objective, test metrics) every k epochs and after the last (0: only after the last).
    timeout : float > 0, default=600
    party_wait : float >= 0, default=0
        Seconds to wait for a missing party (at identify, and for a lost node to come back), as
        :class:`~flower_vfl.strategies.exchange.Exchange`. A restarted SGD party has lost its x_m,
        so the default stops the run naming the party.
    """

    num_parties: int = 2
    loss: Any = "logistic"
    lr: float = 0.1
    lr_schedule: str = "constant"
    lr_decay: float = 0.0
    batch_size: int | None = 256
    max_epochs: int = 20
    fit_intercept: bool = True
    init_scale: float = 0.01
    seed: int = 0
    eval_every: int = 1
    timeout: float = 600.0
    party_wait: float = 0.0

    OWNER, EXAMPLE = "VerticalSGDStrategy", "SGDConfig(num_parties=3, lr=0.05)"

    def __post_init__(self):
        checked = check_params(self.OWNER, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                               SGD_PARAMS)
        for name, value in checked.items():          # typed as the table says
            object.__setattr__(self, name, value)

    @classmethod
    def build(cls, config: "SGDConfig | None" = None, **settings) -> "SGDConfig":
        """``config`` (or the defaults) with ``settings`` (the former keyword arguments) over it;
        an unknown name is refused naming the closest field."""
        return build_config(cls, config, settings)
