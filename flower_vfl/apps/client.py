"""Flower ClientApp: one vertical party per SuperNode.

Node config: ``partition-id`` (the party, required), ``num-partitions``, its data
(``data-path`` + ``id-column`` for its own files, or ``data-dir`` for a bundled dataset:
:mod:`flower_vfl.clients.source`), ``state-dir`` (the party's own folder for its ledger and
answers), ``max-answers``, ``min-rho``/``max-rho``, and the party's own privacy settings
(``dp``, ``dp-epsilon`` ...): the only source of them, since the run config is written by
the server side (docs/privacy.md, "Trust model"). A run config that names the party's files,
ID column, preprocessing or model folder is refused; so is a noise seed in the node config.
"""

import json
import os

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from flower_vfl import routes
from flower_vfl.clients import psi_party
from flower_vfl.clients.base import PartyBase
from flower_vfl.clients.source import declared_source, party_node_config  # noqa: F401  (re-exported)
from flower_vfl.errors import install_log_filter, reply_user_errors
from flower_vfl.clients.vertical_party import VerticalPartyClient
from flower_vfl.clients.party_ssp import SSPPartyClient
from flower_vfl.clients.party_moment import MomentPartyClient
from flower_vfl.config.settings import PRIVACY_KEYS, privacy_from_config, run_setting
from flower_vfl.config.schema import ConfigError, parse_node_config
from flower_vfl.core.losses import loss_class
from flower_vfl.io.party_cache import cached_party_block

app = ClientApp()
install_log_filter()     # our user-facing errors: one line, no traceback (flower_vfl.errors)


def _rho_range(nc: dict, party: int):
    """The party's own (min-rho, max-rho), inclusive; None when neither is set."""
    lo, hi = nc.get("min-rho"), nc.get("max-rho")
    if lo is not None and hi is not None and float(lo) > float(hi):
        raise ConfigError(f"party {party}: node config min-rho={lo!r} is above max-rho={hi!r}; give "
                          "min-rho <= max-rho")
    return None if lo is None and hi is None else (None if lo is None else float(lo),
                                                   None if hi is None else float(hi))


def _party_setup(context: Context):
    """What every vertical party handler reads first, from the node config only where it decides the
    party's data, privacy and budget: ``(rc, nc, party, num_parties, source, D, D_test, privacy)``."""
    rc, nc = context.run_config, party_node_config(context)
    # every key typed and range-checked before anything is read; the run config's privacy
    # values are not read at all (a party's privacy settings are its node config's)
    parse_node_config(nc, {k: v for k, v in rc.items() if k not in PRIVACY_KEYS})
    party = int(run_setting("partition-id", rc, nc))
    num_parties = int(run_setting("num-parties", rc, nc))
    if int(nc.get("dp-seed", -1)) >= 0:
        raise ConfigError(f"party {party}: node config key 'dp-seed'={nc['dp-seed']!r} is refused: a party draws "
                          "its noise from OS entropy only, since noise from a seed repeats in every run and "
                          "two runs' releases would cancel it (docs/privacy.md). Remove dp-seed; seeded noise "
                          "exists only for in-process experiments (PrivacyConfig(seed=...))")
    # the ledger's key and the data read: what the node config declares (a run config naming
    # the party's files, ID column, preprocessing or model folder is refused here)
    source = declared_source(nc, rc, party)
    if source.kind == "files":      # the party's own export, PSI-aligned (docs/own-data.md)
        D, D_test = psi_party.own_blocks(context)[:2]
    else:
        # through the party's on-disk block cache: every message on a real SuperNode is a
        # fresh process, and re-parsing a9a cost seconds per round (flower_vfl.io.party_cache).
        # The folder is the node config's data-dir only (the run config's is the label owner's)
        D, D_test = cached_party_block(source.dataset, party, num_parties, source.data_dir or None,
                                       nc.get("state-dir") or None)
    privacy = privacy_from_config(party, rc, nc, n_rows=D.shape[0])    # dp-lam unset: from its own N
    if privacy is not None and source.kind == "files":
        psi_party.refuse_fitted_preprocessing(context)      # before any release: the bound needs row-local rows
    return rc, nc, party, num_parties, source, D, D_test, privacy


def _party_model(rc, nc, party, source, privacy, D, D_test):
    """The party's block model (core/blocks.py): ``party-model`` from its node config (the run config's
    value only as a default), its settings from its node config; a feature map maps D and D_test once
    here, then the party is the linear block's on the mapped rows. 'linear': the blocks as they are.
    Any other kind: the block model third ('mlp': with the blocks as they are, the party steps its
    network: party_public.py)."""
    from flower_vfl.core.blocks import SETTINGS, block_from_config
    cfg = {"party-model": run_setting("party-model", rc, nc), **{k: nc[k] for k in SETTINGS if k in nc}}
    block = block_from_config(cfg, private=privacy is not None, party=party)
    if block.kind == "linear":
        return D, D_test
    if source.kind == "files" and not block.data_independent:
        raise ConfigError(f"party {party}: party-model={block.kind!r} is refused on own data: its map is fitted on "
                          "the party's rows, and the saved model the predict job scores from would hold them; use "
                          "a data-independent kind ('rff', 'spline', 'bins', 'mlp') or 'linear'")
    if getattr(block, "nonlinear", False):    # a network (core/blocks_mlp.py): the party steps it on D
        return D, D_test, block.fit(D)
    return block.fit_features(D), None if D_test is None else block.features(D_test), block


def make_client(context: Context) -> VerticalPartyClient:
    rc, nc, party, num_parties, source, D, D_test, privacy = _party_setup(context)
    D, D_test, *model = _party_model(rc, nc, party, source, privacy, D, D_test)
    from flower_vfl.clients.party_secagg import PartySecAgg
    loss = str(run_setting("loss", rc, nc))
    # refused before any round (identify): a loss a private party's release does not cover (core/loss_base.py)
    if privacy is not None and not getattr(loss_class(loss), "supports_private_parties", True):
        raise ConfigError(f"party {party} is private and releases one noisy score vector per round; the run "
                          f"config's loss={loss!r} needs K score columns from every party, which its privacy "
                          "calibration does not cover. Refused: use a binary loss (logistic) with this "
                          "party private, or run it without dp")
    secagg = PartySecAgg(party, nc, privacy is not None)     # node config secagg-* only (trusted)
    client = VerticalPartyClient(party, D, D_test, penalty=str(run_setting("penalty", rc, nc)),
                                 lam=float(run_setting("lam", rc, nc)), x_solver=str(run_setting("x-solver", rc, nc)),
                                 privacy=privacy, n_parties=num_parties,
                                 state_dir=nc.get("state-dir") or None,
                                 max_answers=int(nc.get("max-answers", 0)), source=source,
                                 rho_range=_rho_range(nc, party), secagg=secagg)
    if model:                    # the block model the own-data save job writes (its kind and settings)
        client.party_model = model[0]
        if getattr(model[0], "nonlinear", False):     # an MLP (never a private party's: refused by name)
            client.block = model[0]
    return client


def make_ssp_client(context: Context) -> SSPPartyClient:
    """The party of the stacked SSP route (route='stacked-ssp'): the same node-config checks, data,
    privacy settings, store and declared source as :func:`make_client`'s party, so its one SSP
    release is charged in the same ledger as its ADMM releases."""
    rc, nc, party, num_parties, source, D, D_test, privacy = _party_setup(context)
    return SSPPartyClient(party, D, D_test, privacy, state_dir=nc.get("state-dir") or None, source=source)


def make_moment_client(context: Context) -> MomentPartyClient:
    """The party of the moment route (route='moment'): the same node-config checks, data, privacy
    settings, store and declared source as :func:`make_client`'s party (its one moment release is
    charged in the same ledger as its ADMM and SSP releases); its pool consent (``moment-pool``) and
    rho limits (``min-rho`` / ``max-rho``) from its node config only."""
    rc, nc, party, num_parties, source, D, D_test, privacy = _party_setup(context)
    return MomentPartyClient(party, D, D_test, privacy, pool=str(nc.get("moment-pool", "none")),
                             rho_range=_rho_range(nc, party), state_dir=nc.get("state-dir") or None, source=source)


def _handler(name, make, method, doc):
    """The ClientApp handler ``name``: the party ``make(context)`` builds (from its node config, per
    message) answers with its ``method`` (:meth:`~flower_vfl.clients.base.PartyBase.handler`)."""
    return PartyBase.handler(method, make, name, doc)


identify = _handler("identify", make_client, "identify", "The ADMM route's identify (flower_vfl.clients.party_base).")
train = _handler("train", make_client, "train", "One ADMM round (flower_vfl.clients.party_base).")
evaluate = _handler("evaluate", make_client, "evaluate", "The ADMM route's held-out scores "
                    "(flower_vfl.clients.party_base).")


def secagg_keys(msg: Message, context: Context) -> Message:
    if psi_party.uses_own_data(context) and psi_party.STATE_ALIGN + "train" not in context.state:
        return psi_party.secagg_keys(msg, context)      # the predict job: no training rows to build on
    return make_client(context).secagg_keys(msg, context)


ssp_identify = _handler("ssp_identify", make_ssp_client, "identify",
                        "The stacked SSP route's identify (flower_vfl.clients.party_ssp): nothing charged.")
ssp_release = _handler("ssp_release", make_ssp_client, "release",
                       "The stacked SSP route's one release per run (flower_vfl.clients.party_ssp).")
moment_identify = _handler("moment_identify", make_moment_client, "identify",
                           "The moment route's identify (flower_vfl.clients.party_moment): nothing charged.")
moment_release = _handler("moment_release", make_moment_client, "release",
                          "The moment route's one release per run (flower_vfl.clients.party_moment).")
moment_train = _handler("moment_train", make_moment_client, "train", "One ADMM sharing round of the moment route "
                        "on the pool (flower_vfl.clients.party_moment).")
moment_evaluate = _handler("moment_evaluate", make_moment_client, "evaluate",
                           "The moment route's evaluation-row scores (flower_vfl.clients.party_moment).")


# own data (flower_vfl.clients.psi_party): PSI alignment, the saved model, prediction; save_model
# builds the party through make_client, handed over here (clients never import apps)
psi_party.CLIENT_FACTORY = make_client

#: message type -> this app's handler, for every message type of the routes it serves
HANDLERS = {
    # the ADMM route (route='admm'), with secure aggregation's key advert and own data
    "query.identify": identify, "train": train, "evaluate": evaluate, "query.secagg_keys": secagg_keys,
    "query.psi_answer": psi_party.psi_answer, "query.psi_order": psi_party.psi_order,
    "query.save_model": psi_party.save_model, "query.predict": psi_party.predict,
    # the stacked SSP route (route='stacked-ssp', docs/privacy_parties.md): one SSP release per private party
    "query.ssp_identify": ssp_identify, "query.ssp_release": ssp_release,
    # the moment route (route='moment', docs/privacy_parties.md): one moment release, then ADMM on the pool
    "query.moment_identify": moment_identify, "query.moment_release": moment_release,
    "train.moment": moment_train, "evaluate.moment": moment_evaluate,
}
_SERVED = [m for r in routes.for_app("vertical") if r.handlers is None for m in r.messages]
if sorted(_SERVED) != sorted(HANDLERS):
    raise RuntimeError(f"apps/client.py answers {sorted(HANDLERS)} but the vertical routes of flower_vfl.routes "
                       f"without handlers of their own send {sorted(_SERVED)}")
# the ClientApp, built from the route registry (a route folder's own handlers, else this app's).
# Flower calls every handler through reply_user_errors (flower_vfl.errors): a data or config error
# is one line on this node and an error reply naming it, never a traceback (called directly, as
# the tests do, the handlers raise)
for _route in routes.for_app("vertical"):
    _handlers = HANDLERS if _route.handlers is None else _route.load("handlers")
    for _message_type in _route.messages:
        routes.register(app, _message_type, reply_user_errors(_handlers[_message_type]))
