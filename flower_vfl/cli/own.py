"""``flower-vfl`` on own data: ``fit``/``simulate`` with party files, ``predict``, ``model show``.

    flower-vfl fit --labels owner.csv --party bank.parquet --party shop.svm --id-column id
    flower-vfl simulate --labels owner.csv --party bank.parquet --party shop.csv --model-dir runs/m
    flower-vfl predict --labels new_ids.csv --party bank_new.parquet --party shop_new.csv --model-dir runs/m
    flower-vfl model show runs/m/party-1.npz

Parties: when the label owner's file (``--labels``) holds feature columns besides the ID and
the label, the label owner serves them as party 0 and the ``--party`` files are parties 1..M;
otherwise the ``--party`` files are parties 0..M-1.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = ["add_own_args", "own_parties", "fit_own", "own_node_configs", "cmd_model_show"]


def absolute(path: str) -> str:
    """``path`` made absolute against this process's working directory ('' stays '')."""
    from pathlib import Path
    return str(Path(path).expanduser().resolve()) if path else path


def add_own_args(p, predict: bool = False):
    p.add_argument("--party", action="append", default=None, metavar="PATH",
                   help="a party's file (CSV, Parquet or LIBSVM with PATH.ids), once per party"
                        + (" (its rows to score)" if predict else ""))
    p.add_argument("--labels", default="", metavar="PATH",
                   help="the label owner's file: " + ("the IDs to score (and its own columns)" if predict
                                                      else "IDs, labels (and its own columns)"))
    p.add_argument("--preprocess", default="none", choices=["none", "standardize", "maxabs"],
                   help="each party's scaling, fitted on its own aligned training rows")
    p.add_argument("--psi-max-asked", type=float, default=None, metavar="X",
                   help="each simulated party's PSI cap: distinct IDs ever asked, as a multiple of its own "
                        "number of IDs (node-config key psi-max-asked; default 1.0)")


def _has_features(path, id_column, label_column) -> bool:
    """Whether the label owner's file holds columns besides the ID and the label."""
    from pathlib import Path

    from flower_vfl.io import DataError, source_from_config
    if not Path(path).is_file():
        raise DataError(f"the label owner's file {path} does not exist; fix --labels")
    fmt = source_from_config({"data-path": path}).resolved_format()
    if fmt == "libsvm":
        return True
    if fmt == "csv":
        from pyarrow import csv
        with csv.open_csv(path) as reader:
            names = reader.schema.names
    else:
        import pyarrow.parquet as pq
        names = pq.read_schema(path).names
    return bool(set(names) - {id_column, label_column})


def own_parties(args) -> list[dict]:
    """Each party's node config (index = partition-id)."""
    idc = getattr(args, "id_column", None) or "id"
    lab = getattr(args, "label_column", None) or "label"
    if not args.labels:
        raise SystemExit("--party needs --labels (the label owner's file with the IDs and labels)")
    parties = []
    if _has_features(args.labels, idc, lab):
        parties.append({"data-path": absolute(args.labels), "label-column": lab})
    parties += [{"data-path": absolute(p)} for p in args.party]
    for m, cfg in enumerate(parties):
        cfg.update({"partition-id": m, "id-column": idc, "preprocess": args.preprocess})
        if getattr(args, "psi_max_asked", None) is not None:
            cfg["psi-max-asked"] = float(args.psi_max_asked)
    return parties


def fit_own(args, rc) -> int:
    """The in-process engine on the parties' files, aligned on their common IDs (one operator
    holds every file here, so the intersection is computed directly, in the label owner's order)."""
    from flower_vfl import VerticalADMM
    from flower_vfl.io import Preprocessor, read_party, source_from_config
    parties = own_parties(args)
    lab = getattr(args, "label_column", None) or "label"
    owner = read_party(source_from_config({"data-path": args.labels, "id-column": parties[0]["id-column"],
                                           "label-column": lab}))
    tabs = [read_party(source_from_config(cfg, forbidden_label=lab)) for cfg in parties]
    common = set(owner.ids.tolist())
    for t in tabs:
        common &= set(t.ids.tolist())
    order = [i for i in owner.ids.tolist() if i in common]
    if len(order) < 2:
        raise SystemExit(f"only {len(order)} IDs are common to {args.labels} and every --party file")
    blocks = []
    for t in tabs:
        pos = {v: k for k, v in enumerate(t.ids.tolist())}
        idx = [pos[i] for i in order]
        pre = Preprocessor(args.preprocess)
        blocks.append(pre.fit_transform(t.X[idx], t.columns, {c: v[idx] for c, v in t.categorical.items()}))
    opos = {v: k for k, v in enumerate(owner.ids.tolist())}
    y = owner.y[[opos[i] for i in order]]
    model = VerticalADMM(loss=args.loss, penalty=args.penalty, lam=args.lam,
                         rho=args.rho if args.rho > 0 else "auto", max_rounds=args.max_rounds, tol=args.tol,
                         verbose=True).fit(blocks, y)
    out = {"n_aligned": len(order), "n_owner": int(owner.n_rows), "widths": model.n_features_in_,
           "round": model.n_rounds_, "objective": model.history_[-1]["objective"],
           "train_score": model.score(blocks, y)}
    print(json.dumps(out))
    if args.out_dir:
        from pathlib import Path
        path = model.save(Path(args.out_dir) / "model.npz")
        print(f"wrote {path}")
    return 0


def own_node_configs(args, rc: dict, nodes: dict) -> tuple[dict, dict, int]:
    """(run config, node configs, num-parties) of a simulated own-data run or predict job.

    Each party's files, ID column, preprocessing and model folder go in its node config (which
    ``flower-vfl simulate`` writes to the parties' FLOWER_VFL_NODE_CONFIG file): only a party's
    node config names its data (docs/own-data.md). The run config keeps the label owner's keys."""
    parties = own_parties(args)
    predict = str(rc.get("mode", "train")) == "predict"
    model_dir = absolute(rc.get("model-dir") or rc.get("out-dir") or "vfl-model")
    rc = dict(rc, **{"num-parties": len(parties), "model-dir": model_dir, "id-column": parties[0]["id-column"]})
    rc.pop("preprocess", None)
    if predict:                        # the same files name the rows to score
        rc["score-ids-path"] = absolute(args.labels)
    else:
        rc["labels-path"] = absolute(args.labels)
    out = {}
    for m, cfg in enumerate(parties):
        cfg = dict(cfg, **{"model-dir": model_dir})
        if predict:
            cfg["score-path"] = cfg.pop("data-path")
        out[m] = {**nodes.get(m, {}), **cfg, "partition-id": m}
    return rc, out, len(parties)


def cmd_model_show(args) -> int:
    from flower_vfl.io.model_files import describe
    print(json.dumps(describe(args.path), indent=2, default=lambda o: np.asarray(o).tolist()))
    return 0
