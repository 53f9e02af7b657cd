"""Shared by the own-data tests: write a9a as party files, run the Flower path in process,
and fit the in-process engine on the same aligned intersection (the reference)."""

from __future__ import annotations

import numpy as np

from flower_vfl import VerticalADMM
from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.io import read_party, source_from_config
from flower_vfl.io.bundled import write_party_files
from flower_vfl.deploy.local_grid import LocalGrid

HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify,
            "query.psi_answer": ca.psi_party.psi_answer, "query.psi_order": ca.psi_party.psi_order,
            "query.save_model": ca.psi_party.save_model, "query.predict": ca.psi_party.predict}
#: the issue's split: the label owner holds features 1-40, the parties 41-80 and 81-123
RANGES = [(0, 40), (40, 80), (80, 123)]
EXT = {"csv": ".csv", "parquet": ".parquet", "libsvm": ".svm"}


def write_a9a_files(tmp, X, y, Xt, fmt="csv", n_extra=50):
    """Training files (5 % of rows missing at party 1, extra rows at party 2, each file
    shuffled) and the scoring files of a9a.t (a fourth, shuffled file at the label owner)."""
    ids = [f"u{i:06d}" for i in range(X.shape[0])]
    train = write_party_files(X, y, ids, RANGES, tmp, fmt, seed=3, missing={1: 0.05}, extra={2: n_extra})
    tids = [f"t{i:06d}" for i in range(Xt.shape[0])]
    score = write_party_files(Xt, np.zeros(Xt.shape[0]), tids, RANGES, tmp, fmt, seed=4,
                              missing={2: 0.02}, prefix="score")
    return train, score


def node_configs(train, score, fmt, tmp, extra=None):
    cfgs = {}
    for m in range(3):
        # psi-max-asked: party 1 lacks 5 % of the label owner's rows, so the label owner asks it
        # about 1/0.95 x its own number of IDs (the default cap, 1.0x, would refuse that)
        cfg = {"partition-id": m, "data-path": str(train[m]), "score-path": str(score[m]),
               "model-dir": str(tmp / f"models-party{m}"), "psi-max-asked": 1.25}
        if m == 0:
            cfg["label-column"] = "label"      # the label owner's own SuperNode serves its columns
        if fmt == "libsvm":
            cfg["n-features"] = RANGES[m][1] - RANGES[m][0]
        cfg.update((extra or {}).get(m, {}))
        cfgs[100 + m] = cfg
    return cfgs


def run_config(train, score, tmp, **kw):
    rc = {"num-parties": 3, "max-rounds": 15, "lam": 1e-3, "labels-path": str(train[0]),
          "label-column": "label", "score-ids-path": str(score[0]), "model-dir": str(tmp / "owner")}
    rc.update(kw)
    return rc


def run_train(rc, nodes, on_reply=None):
    grid = LocalGrid(HANDLERS, nodes, rc, on_reply=on_reply)
    from flower_vfl.strategies import own_data
    return own_data.train(grid, rc, sa.make_strategy), grid


def run_predict(rc, nodes, grid=None, on_reply=None):
    from flower_vfl.strategies import own_data
    grid = LocalGrid(HANDLERS, nodes, dict(rc, mode="predict"), on_reply=on_reply)
    return own_data.predict(grid, dict(rc, mode="predict"))


def reference(nodes, rc, privacy=None):
    """The engine fitted on the aligned intersection (computed here with plain set logic)."""
    tabs = [read_party(source_from_config(nodes[100 + m], "train")) for m in range(3)]
    common = set(tabs[0].ids)
    for t in tabs[1:]:
        common &= set(t.ids)
    order = [i for i in tabs[0].ids if i in common]          # the label owner's row order
    blocks = [t.X[_rows(t, order)] for t in tabs]
    y = tabs[0].y[_rows(tabs[0], order)]
    kw = {"acceleration": rc["acceleration"]} if "acceleration" in rc else {}
    model = VerticalADMM(lam=rc["lam"], max_rounds=rc["max-rounds"], tol=0, privacy=privacy, **kw).fit(blocks, y)
    stabs = [read_party(source_from_config(nodes[100 + m], "score")) for m in range(3)]
    scommon = set(stabs[0].ids)
    for t in stabs[1:]:
        scommon &= set(t.ids)
    sorder = [i for i in stabs[0].ids if i in scommon]
    sblocks = [t.X[_rows(t, sorder)] for t in stabs]
    return model, order, sorder, model.decision_function(sblocks)


def _rows(table, order):
    pos = {v: k for k, v in enumerate(table.ids)}
    return [pos[i] for i in order]
