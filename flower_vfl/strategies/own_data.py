"""The label owner's own-data runs: PSI alignment, training, saved models, prediction jobs.

Called by the ServerApp when the run config names a labels file (``labels-path``); glue
only: reading is :mod:`flower_vfl.io`, the protocol :mod:`flower_vfl.io.psi`, the file format
:mod:`flower_vfl.io.model_files`.

Run-config keys (the label owner's; a party's keys are in its node config, see
:mod:`flower_vfl.io.sources`):

====================  =======================================================================
``mode``              ``train`` (default) or ``predict``
``labels-path``       the label owner's training file: the ID column and the label column
``labels-test-path``  held-out IDs and labels, scored in the evaluation rounds (optional)
``score-ids-path``    ``mode=predict``: the file naming the rows to score by ID
``id-column``         the ID column of the label owner's files (default ``id``)
``label-column``      the label column (default ``label``); refused in a party's file
``model-dir``         where the label owner keeps its model file (``label-owner.npz``)
``predictions-path``  ``mode=predict``: the CSV written (default ``<model-dir>/predictions.csv``)
``psi-structure``     ``raw`` (exact, default), ``gcs`` or ``bloom``
``psi-fpr``           false-positive rate of gcs / bloom (default 1e-9)
====================  =======================================================================
"""

from __future__ import annotations

import csv
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flower_vfl.io import model_files as model_io
from flower_vfl.core.losses import get_loss
from flower_vfl.io import DataError, read_party, source_from_config
from flower_vfl.core.scoring import BINARY_LOSSES, decode_scores, encode_classes
from flower_vfl.config.schema import ConfigError
from flower_vfl.config.settings import run_setting
from flower_vfl.core.scoring import combine
from flower_vfl.strategies.exchange import ReplyError, check_release, party_keys_from
from flower_vfl.strategies.psi_align import PSIAlignment

__all__ = ["OWN_DATA_DEFAULTS", "enabled", "owner_labels", "train", "predict", "owner_model_path"]

OWN_DATA_DEFAULTS = {"mode": "train", "labels-path": "", "labels-test-path": "", "score-ids-path": "",
                     "id-column": "id", "label-column": "label", "model-dir": "", "predictions-path": "",
                     "psi-structure": "raw", "psi-fpr": 1e-9}


def _get(rc, key):
    v = rc.get(key, OWN_DATA_DEFAULTS[key])
    return OWN_DATA_DEFAULTS[key] if v is None else v


def enabled(run_config) -> bool:
    return bool(_get(run_config, "labels-path")) or _get(run_config, "mode") == "predict"


def owner_labels(run_config, key="labels-path", labels=True):
    """(ids, y) of the label owner's file named by ``key`` (y None when ``labels`` is False)."""
    cfg = {"data-path": str(_get(run_config, key)), "id-column": _get(run_config, "id-column"),
           "label-column": _get(run_config, "label-column") if labels else ""}
    src = source_from_config(cfg, "train")
    import dataclasses
    t = read_party(dataclasses.replace(src, labels_only=True))
    return t.ids, t.y


def owner_model_path(run_config) -> Path:
    base = run_config.get("model-dir") or run_config.get("out-dir") or "vfl-model"
    return Path(str(base)) / "label-owner.npz"


def _align(grid, ids, num_parties, split, run_config, timeout):
    return PSIAlignment(ids, num_parties, split, structure=str(_get(run_config, "psi-structure")),
                        fpr=float(_get(run_config, "psi-fpr")), timeout=timeout,
                        party_wait=float(run_setting("party-wait", run_config)),
                        party_keys=party_keys_from(str(run_setting("party-keys", run_config)), num_parties)).run(grid)


def train(grid: Grid, run_config, make_strategy, progress=None, timeout: float = 600.0):
    """Align (train and, if named, held-out rows), train, then every owner saves its model."""
    num_parties = int(run_config.get("num-parties", 2))
    loss_name = str(run_config.get("loss", "logistic"))
    ids, y = owner_labels(run_config)
    t, classes = encode_classes(y, loss_name)
    al = _align(grid, ids, num_parties, "train", run_config, timeout)
    t_test = None
    if _get(run_config, "labels-test-path"):
        ids_te, y_te = owner_labels(run_config, "labels-test-path")
        al_te = _align(grid, ids_te, num_parties, "test", run_config, timeout)
        t_test = _encode_like(y_te[al_te.order], classes, loss_name, str(_get(run_config, "labels-test-path")))
    strategy = make_strategy(run_config, t[al.order], t_test, ids=np.asarray(ids)[al.order])
    strategy.progress = progress
    strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=strategy.max_rounds,
                   timeout=strategy.round_timeout)
    # every party saves its own block on its own disk; only an acknowledgement comes back
    # (the training run's exchange: a party that does not acknowledge is waited for, then named)
    content = RecordDict({"config": ConfigRecord({"loss": loss_name,
                                                  "rounds": int(strategy.final_.get("rounds", 0))})})
    acks = strategy.exchange.send(lambda p, nid: content, "query.save_model", range(num_parties), "save model")
    for party, rep in sorted(acks.items()):
        if "saved" not in rep.content:
            raise ReplyError(f"party {party} (node {rep.metadata.src_node_id}): the save-model reply has no "
                             f"'saved' acknowledgement (records: {sorted(rep.content.keys())})")
    path = model_io.save_owner_model(owner_model_path(run_config), np.asarray(strategy.central.b), loss_name,
                                     classes, {k: v for k, v in dict(run_config).items()}, strategy.history_,
                                     extra={"n_train": int(al.order.size), "parties": num_parties})
    log(INFO, "label owner's model saved to %s; each party saved its own block", path)
    strategy.alignment_ = al
    return strategy


def _encode_like(y, classes, loss_name, path="the held-out file"):
    if classes is None or loss_name not in BINARY_LOSSES:
        return encode_classes(y, loss_name)[0]
    unknown = sorted(set(np.asarray(y).tolist()) - set(classes.tolist()))
    if unknown:
        raise DataError(f"{path}: held-out labels {unknown[:5]} are not among the training classes "
                        f"{classes.tolist()}; give held-out rows labelled like the training rows")
    return np.where(np.asarray(y) == classes[1], 1.0, -1.0)


def _secagg_request(al, ids, num_parties: int, cfg: dict):
    """Secure aggregation of the predict job (run config ``secagg=true``; docs/secagg.md): every
    party's key advert, then ``cfg`` gains the roster, the parties summed and the digest of the
    agreed scoring order (each party checks it against the order it aligned to)."""
    from flower_vfl.io import psi
    from flower_vfl.strategies.secagg_central import CentralSecAgg
    if num_parties < 2:
        raise ConfigError(f"secagg=true needs at least 2 parties in the sum; the predict job has num-parties="
                          f"{num_parties}: set secagg=false or add a party")
    secagg = CentralSecAgg()
    secagg.keys(al.exchange, num_parties)
    cfg["order-digest"] = psi.ids_digest([str(ids[i]) for i in al.order])
    cfg.update(secagg.fields(range(num_parties)))
    return secagg


def predict(grid: Grid, run_config, timeout: float = 600.0) -> dict:
    """Score the rows named by ``score-ids-path``: PSI against each party's scoring file, each
    party returns D_m x_m from its saved model, the label owner writes the predictions.

    The same code as the evaluation rounds during training (:mod:`flower_vfl.core.scoring`): the
    party's handler calls :func:`~flower_vfl.core.scoring.party_scores`, the label owner checks each
    reply as a training-time release (:func:`~flower_vfl.strategies.exchange.check_release`) and
    calls :func:`~flower_vfl.core.scoring.combine`. With ``secagg=true`` every party masks its
    scores and the label owner decodes only their sum (:func:`_secagg_request`)."""
    num_parties = int(run_config.get("num-parties", 2))
    if not _get(run_config, "score-ids-path"):
        raise ConfigError("mode=predict needs the run-config key score-ids-path (a file with the IDs to score)")
    m = model_io.load_model(owner_model_path(run_config))
    meta = m["meta"]
    loss = get_loss(meta["loss"])
    classes = None if meta["classes"] is None else np.asarray(meta["classes"])
    ids, _ = owner_labels(run_config, "score-ids-path", labels=False)
    al = _align(grid, ids, num_parties, "score", run_config, timeout)
    cfg = {"split": "score"}
    secagg = None
    if bool(run_setting("secagg", run_config)):
        secagg = _secagg_request(al, ids, num_parties, cfg)
    content = RecordDict({"config": ConfigRecord(cfg)})          # the same message for every party
    shape = (int(al.order.size),) + np.shape(m["intercept"])
    replies = al.exchange.send(lambda p, nid: content, "query.predict", range(num_parties), "predict")
    bound = float(run_setting("max-release", run_config))
    if secagg is None:
        parts = {party: check_release(rep, party, "s_score", shape, "predict", bound=bound)
                 for party, rep in replies.items()}
        f = combine(parts, m["intercept"], range(num_parties), "scores for the predict job")
    else:       # only the sum: a party missing or masks that do not cancel give no scores
        f = secagg.total(replies, range(num_parties), "s_score", shape, "predict") + m["intercept"]
    labels, proba = decode_scores(f, loss, classes)
    scored = [ids[i] for i in al.order]
    out = Path(str(_get(run_config, "predictions-path") or owner_model_path(run_config).parent / "predictions.csv"))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as fh:
        w = csv.writer(fh)
        head = [str(_get(run_config, "id-column")), "score"]
        if proba is not None:
            head.append("probability")
        w.writerow(head + ["class"])
        for i, rid in enumerate(scored):
            row = [rid, repr(float(np.ravel(f[i])[0]) if np.ndim(f) == 1 else f[i].tolist())]
            if proba is not None:
                row.append(repr(float(proba[i, -1])) if proba.shape[1] == 2 else proba[i].tolist())
            w.writerow(row + [labels[i]])
    log(INFO, "predictions for %d of the %d requested rows written to %s", len(scored), len(ids), out)
    return {"ids": scored, "scores": f, "labels": labels, "proba": proba, "path": str(out),
            "n_requested": len(ids)}
