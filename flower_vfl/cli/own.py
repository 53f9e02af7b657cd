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

__all__ = ["add_own_args", "check_own_flags", "own_parties", "own_blocks", "own_node_configs", "cmd_model_show",
           "save_flower_model"]


def absolute(path: str) -> str:
    """``path`` made absolute against this process's working directory ('' stays '')."""
    from pathlib import Path
    return str(Path(path).expanduser().resolve()) if path else path


def add_own_args(p, predict: bool = False, fit: bool = False):
    p.add_argument("--party", action="append", default=None, metavar="PATH",
                   help="a party's file (CSV, Parquet or LIBSVM with PATH.ids), once per party"
                        + (" (its rows to score)" if predict else ""))
    p.add_argument("--labels", default="", metavar="PATH",
                   help="the label owner's file: " + ("the IDs to score (and its own columns)" if predict
                                                      else "IDs, labels (and its own columns)"))
    if not predict:
        p.add_argument("--labels-test", default="", metavar="PATH",
                       help="the label owner's held-out file (IDs, labels and its own columns): test metrics; "
                            "needs one --party-test per --party")
        p.add_argument("--party-test", action="append", default=None, metavar="PATH",
                       help="a party's held-out file, once per --party, in the same order")
    p.add_argument("--id-column", default=None, help="own data: the ID column of every file (default 'id')")
    if not predict:                        # a predict job: the saved model's labels and scaling
        p.add_argument("--label-column", default=None, help="own data: the label column of the label owner's "
                                                            "files (default 'label')")
        p.add_argument("--preprocess", default=None, choices=["none", "standardize", "maxabs"],
                       help="each party's scaling, fitted on its own aligned training rows (default 'none')")
    if not fit:                            # the in-process fit intersects the IDs directly, no PSI
        p.add_argument("--psi-max-asked", type=float, default=None, metavar="X",
                       help="each simulated party's PSI cap: distinct IDs ever asked, as a multiple of its own "
                            "number of IDs (node-config key psi-max-asked; default 1.0)")


def check_own_flags(args):
    """Own-data flags given without --party are refused (they would have no effect)."""
    from flower_vfl.config.schema import ConfigError
    given = [f for f, v in (("--labels", args.labels), ("--labels-test", getattr(args, "labels_test", "")),
                            ("--party-test", getattr(args, "party_test", None)),
                            ("--preprocess", getattr(args, "preprocess", None)), ("--id-column", args.id_column),
                            ("--label-column", getattr(args, "label_column", None)),
                            ("--psi-max-asked", getattr(args, "psi_max_asked", None))) if v]
    if given and not args.party:
        raise ConfigError(f"{given[0]} has no effect without --party (own data: the label owner's file with "
                          "--labels, each party's file with --party)")
    bundled = [f for f in ("dataset", "data_dir") if getattr(args, f, None)]
    if bundled and args.party:
        raise ConfigError(f"--{bundled[0].replace('_', '-')} has no effect with --party (a bundled dataset; own "
                          "data is read from the --labels and --party files)")


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


def own_parties(args, num_parties=None) -> list[dict]:
    """Each party's node config (index = partition-id); ``num_parties`` (``--num-parties`` when
    given) must be their number."""
    from flower_vfl.config.schema import ConfigError
    idc = args.id_column or "id"
    lab = getattr(args, "label_column", None) or "label"
    if not args.labels:
        raise ConfigError("--party needs --labels (the label owner's file with the IDs and labels)")
    tests = getattr(args, "party_test", None) or []
    for flag, files in (("--party", args.party), ("--party-test", tests)):
        seen = {}
        for f in files:
            key = absolute(f)
            if key in seen:
                raise ConfigError(f"{flag} {f} is given twice (parties {seen[key]} and {len(seen)}): each party's "
                                  "file once, one --party per party")
            seen[key] = len(seen)
    from pathlib import Path

    from flower_vfl.io import DataError
    labels_test = getattr(args, "labels_test", "")
    for flag, files in (("--party", args.party), ("--party-test", tests),
                        ("--labels-test", [labels_test] * bool(labels_test))):
        for f in files:
            if not Path(f).is_file():
                raise DataError(f"the file {f} given with {flag} does not exist; fix {flag}")
    if (tests or getattr(args, "labels_test", "")) and not (getattr(args, "labels_test", "") and
                                                            len(tests) == len(args.party)):
        raise ConfigError(f"held-out files: give --labels-test and one --party-test per --party ({len(args.party)} "
                          f"--party, {len(tests)} --party-test{', no --labels-test' if not args.labels_test else ''})")
    parties = []
    if _has_features(args.labels, idc, lab):
        parties.append({"data-path": absolute(args.labels), "label-column": lab,
                        **({"test-path": absolute(args.labels_test)} if tests else {})})
    parties += [{"data-path": absolute(p), **({"test-path": absolute(t)} if tests else {})}
                for p, t in zip(args.party, tests or [None] * len(args.party))]
    if num_parties is not None and num_parties != len(parties):
        owner = " (the label owner's own columns are party 0)" if len(parties) > len(args.party) else ""
        raise ConfigError(f"--num-parties={num_parties} but the files make {len(parties)} parties{owner}; drop "
                          "--num-parties (own data: one party per file)")
    for m, cfg in enumerate(parties):
        cfg.update({"partition-id": m, "id-column": idc, "preprocess": getattr(args, "preprocess", None) or "none"})
        if getattr(args, "psi_max_asked", None) is not None:
            cfg["psi-max-asked"] = float(args.psi_max_asked)
    return parties


def _aligned(owner, tabs, preprocessors, what):
    """Blocks and labels on the IDs common to the label owner's file and every party's file, in
    the label owner's order (one operator holds every file here: a plain intersection)."""
    mine = set(owner.ids.tolist())
    common = set(mine)
    for t in tabs:
        common &= set(t.ids.tolist())
    order = [i for i in owner.ids.tolist() if i in common]
    if len(order) < 2:
        from flower_vfl.io import DataError
        pairwise = ", ".join(f"party {m}: {len(mine & set(t.ids.tolist()))}" for m, t in enumerate(tabs))
        raise DataError(f"only {len(order)} IDs are common to the label owner's {what} file and every party's "
                        f"(IDs shared with the label owner's {len(mine)}: {pairwise}); check that every file's "
                        "--id-column (default 'id') holds the same IDs in the same format (e.g. '00123' vs '123', "
                        "'7' vs '7.0') and that the files cover the same people")
    blocks = []
    for t, pre in zip(tabs, preprocessors):
        pos = {v: k for k, v in enumerate(t.ids.tolist())}
        idx = [pos[i] for i in order]
        cats = {c: v[idx] for c, v in t.categorical.items()}
        blocks.append(pre.fit_transform(t.X[idx], t.columns, cats) if what == "training"
                      else pre.transform(t.X[idx], cats))
    opos = {v: k for k, v in enumerate(owner.ids.tolist())}
    return blocks, owner.y[[opos[i] for i in order]], order


def own_blocks(args):
    """``flower-vfl fit`` on the parties' files: (train blocks, y, test blocks or None, y_test or
    None, info), aligned on the common IDs; each party's preprocessing fitted on its own aligned
    training rows and applied to its held-out rows."""
    from flower_vfl.io import Preprocessor, read_party, source_from_config
    parties = own_parties(args, getattr(args, "num_parties", None))
    idc, lab = parties[0]["id-column"], getattr(args, "label_column", None) or "label"

    def owner(path):
        return read_party(source_from_config({"data-path": path, "id-column": idc, "label-column": lab}))

    def tables(key):
        return [read_party(source_from_config(dict(cfg, **{"data-path": cfg[key]}), forbidden_label=lab))
                for cfg in parties]
    pres = [Preprocessor(p["preprocess"]) for p in parties]
    own = owner(args.labels)
    train, y, order = _aligned(own, tables("data-path"), pres, "training")
    info = {"n_aligned": len(order), "n_owner": int(own.n_rows), "widths": [b.shape[1] for b in train],
            "_preprocessors": pres, "_ids": np.asarray(order)}     # for the model files (popped by fit)
    if not getattr(args, "labels_test", ""):
        return train, y, None, None, info
    test, yt, torder = _aligned(owner(args.labels_test), tables("test-path"), pres, "held-out")
    info["n_aligned_test"] = len(torder)
    return train, y, test, yt, info


def own_node_configs(args, rc: dict, nodes) -> tuple[dict, dict, int]:
    """(run config, node configs, num-parties) of a simulated own-data run or predict job;
    ``nodes`` holds the parties' other settings, or is ``n -> them`` once the files say how many
    parties there are (privacy: :func:`flower_vfl.cli.commands.local_node_configs`).

    Each party's files, ID column, preprocessing and model folder go in its node config (which
    ``flower-vfl simulate`` writes to the parties' FLOWER_VFL_NODE_CONFIG file): only a party's
    node config names its data (docs/own-data.md). The run config keeps the label owner's keys."""
    parties = own_parties(args, rc.get("num-parties"))
    predict = str(rc.get("mode", "train")) == "predict"
    model_dir = absolute(rc.get("model-dir") or rc.get("out-dir") or "vfl-model")
    rc = dict(rc, **{"num-parties": len(parties), "model-dir": model_dir, "id-column": parties[0]["id-column"]})
    rc.pop("preprocess", None)             # each party's own setting, in its node config
    if getattr(args, "label_column", None):
        rc["label-column"] = args.label_column
    if predict:                        # the same files name the rows to score
        rc["score-ids-path"] = absolute(args.labels)
    else:
        rc["labels-path"] = absolute(args.labels)
        if getattr(args, "labels_test", ""):
            rc["labels-test-path"] = absolute(args.labels_test)
    out, nodes = {}, nodes(len(parties)) if callable(nodes) else nodes
    for m, cfg in enumerate(parties):
        cfg = dict(cfg, **{"model-dir": model_dir})
        if predict:
            cfg["score-path"] = cfg.pop("data-path")
        base = {k: v for k, v in nodes.get(m, {}).items() if k != "data-dir"}   # the files, not a bundled folder
        out[m] = {**base, **cfg, "partition-id": m}
    return rc, out, len(parties)


def cmd_model_show(args) -> int:
    from flower_vfl.io.model_files import describe
    print(json.dumps(describe(args.path), indent=2, default=lambda o: np.asarray(o).tolist()))
    return 0


def save_flower_model(model_dir, model, train, preprocessors, ids, loss_name: str, run_config: dict) -> list:
    """The in-process ``fit``'s model as the files a Flower run saves (what ``flower-vfl predict
    --model-dir`` reads): ``label-owner.npz`` and one ``party-<m>.npz`` per party (a private
    party's block is its released x̃, as on its own SuperNode). Returns the paths written."""
    from pathlib import Path
    from flower_vfl.io import model_files as model_io
    private = [p is not None for p in (model.privacy if isinstance(model.privacy, list)
                                       else [model.privacy] * len(train))]
    run = {"loss": loss_name, "rounds": int(model.history_[-1].get("round", len(model.history_))),
           "engine": "in-process"}
    paths = []
    for m, (D, pre, x) in enumerate(zip(train, preprocessors, model.coef_)):
        paths.append(model_io.save_party_model(Path(model_dir) / f"party-{m}.npz", m, x, pre.feature_names_,
                                               pre.to_dict(), model_io.data_fingerprint(D, ids), D.shape[0],
                                               private=private[m], extra={"run": run}))
    paths.append(model_io.save_owner_model(Path(model_dir) / "label-owner.npz", np.asarray(model.intercept_), loss_name,
                                           model.classes_, dict(run_config), list(model.history_),
                                           extra={"n_train": int(len(ids)), "parties": len(train),
                                                  "engine": "in-process"}))
    return paths
