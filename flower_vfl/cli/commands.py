"""``flower-vfl``: run the in-process engine or the Flower simulation, account and audit privacy.

    flower-vfl fit --dataset breast_cancer --num-parties 3 --out-dir runs/demo
    flower-vfl fit --dataset a9a --num-parties 2 --dp --dp-epsilon 1 --dp-parties 1 --dp-lam 3e-3
    flower-vfl simulate --dataset a9a --num-parties 2 --max-rounds 20 --out-dir runs/flwr
    flower-vfl epsilon --noise-multiplier 10 --rounds 20 --delta 1e-5
    flower-vfl audit --dataset a9a --party 1 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from flower_vfl.config.settings import RUN_DEFAULTS, privacy_from_config
from flower_vfl.config.schema import SCHEMA, ConfigError, check_value, parse_run_config
from flower_vfl.cli.checks import cli_words
from flower_vfl.cli.own import absolute
from flower_vfl.errors import UserError


#: run-config keys that name a file or folder: made absolute on the command line, since the
#: ServerApp and ClientApps they reach run in Flower's processes, from another working directory
PATH_KEYS = ("out-dir", "resume", "party-keys", "data-dir", "state-dir", "labels-path", "labels-test-path",
             "score-ids-path", "model-dir", "predictions-path")

#: the flags of each command, by schema key (every flag changes the run or what is passed on:
#: tests/test_every_key.py). The model and the parties' privacy: every run command
MODEL_KEYS = ("dataset", "num-parties", "loss", "penalty", "lam", "rho", "alpha", "fit-intercept", "acceleration", "variant",
              "x-solver", "max-rounds", "tol", "eval-every", "label-epsilon", "out-dir", "data-dir", "dp",
              "dp-parties", "party-model")
#: only where Flower runs the job (simulate, predict, deploy-local): faults, checkpoints, keys
FLOWER_KEYS = ("round-timeout", "party-wait", "stragglers", "max-staleness", "resume", "party-keys", "state-dir",
               "max-release")
#: own data through Flower (simulate, predict): the label owner's keys (--labels, --labels-test
#: and the command set labels-path, labels-test-path, score-ids-path and mode)
OWN_FLOWER_KEYS = ("model-dir", "psi-structure", "psi-fpr")
#: run keys the commands set themselves, not flags: the flag or command that sets each
SET_BY_COMMAND = {"mode": "flower-vfl predict", "labels-path": "--labels", "labels-test-path": "--labels-test",
                  "score-ids-path": "flower-vfl predict --labels"}
#: a party's privacy settings: handed to the simulated parties as node configs (dp-seed: fit only,
#: a party refuses a seed)
PARTY_FLAGS = tuple(k for k, s in SCHEMA.items() if s.scope == "party" and k != "dp-seed")


def _run_config(args, command: str | None = None) -> dict:
    """The run config the command line sets (only the flags given, and ``--run-config``), every
    value checked by the schema before anything runs; paths made absolute. With ``command``
    ('fit', 'simulate', 'deploy-local'), also :func:`flower_vfl.cli.checks.preflight`: what
    would fail later (outputs, data, private settings) is refused now, naming the flag."""
    rc = {}
    for key in SCHEMA:
        attr = key.replace("-", "_")
        if key in RUN_DEFAULTS and getattr(args, attr, None) is not None:
            rc[key] = getattr(args, attr)
    extra = getattr(args, "run_config", None)
    if extra:                              # flwr's own syntax, checked by our schema first
        from flwr.common.config import parse_config_args
        try:
            given = parse_config_args([extra])
        except Exception as exc:
            raise ConfigError(f"--run-config {extra!r} is not 'key=value ...' ({exc})") from None
        parse_run_config(given, source="--run-config")
        rc.update(given)
    check = dict(rc)
    if getattr(args, "party", None) and "num-parties" not in rc:    # own data: one party per file (checked later)
        check["num-parties"] = len(args.party) + 1
    cfg = parse_run_config(check, source="command line")     # every value checked before any round
    if cfg["data-dir"] and cfg["dataset"] == "breast_cancer" and not getattr(args, "party", None):
        raise ConfigError("--data-dir is read only with --dataset a9a (breast_cancer ships with scikit-learn); "
                          "drop --data-dir or add --dataset a9a")
    if getattr(args, "party", None) is not None or hasattr(args, "labels"):
        from flower_vfl.cli.own import check_own_flags
        check_own_flags(args)
    if command is not None:
        from flower_vfl.cli.checks import preflight
        preflight(cfg, _party_flags(args), args, command)
    for key in PATH_KEYS:
        if isinstance(rc.get(key), str):
            rc[key] = absolute(rc[key])
    return rc


def _party_flags(args) -> dict:
    """The ``--dp-*`` flags given (a party's own settings), checked; refused without ``--dp``."""
    given = {k: getattr(args, k.replace("-", "_")) for k in (*PARTY_FLAGS, "dp-seed")
             if getattr(args, k.replace("-", "_"), None) is not None}
    for key, value in given.items():
        check_value(key, value, "command line")
    if given and not getattr(args, "dp", False):
        raise ConfigError(f"--{next(iter(given))} has no effect without --dp (the parties would release exact "
                          "values); add --dp, or drop the flag")
    if getattr(args, "dp_parties", None) and not getattr(args, "dp", False):
        raise ConfigError("--dp-parties has no effect without --dp; add --dp, or drop --dp-parties")
    return given


def _add_key(p, key, default_help=True):
    spec = SCHEMA[key]
    help_text = spec.help.replace("%", "%%") + (f" (default {spec.default!r})" if default_help else "")
    if spec.type is bool:
        if key == "dp":
            p.add_argument("--dp", action="store_true", default=None,
                           help="private parties: those --dp-parties names (all when it is empty) release "
                                "under differential privacy, each under its own budget (--dp-epsilon ...)")
        else:
            p.add_argument(f"--{key}", type=_bool, default=None, metavar="true|false", help=help_text)
        return
    p.add_argument(f"--{key}", type=spec.type, default=None, choices=spec.choices, help=help_text)


#: a predict job: the saved model decides the model; these keys choose the job's own settings
PREDICT_KEYS = ("party-wait", "party-keys", "model-dir", "psi-structure", "psi-fpr", "predictions-path")


def _add_run_args(p, flower: bool = True, own: bool = False, predict: bool = False):
    """The flags of one run command, typed by the schema: the model and the parties' privacy;
    with ``flower``, the Flower job's keys and ``--run-config``; ``own``: own data via Flower;
    ``predict``: only a predict job's keys."""
    keys = PREDICT_KEYS if predict else MODEL_KEYS + PARTY_FLAGS + (
        ("dp-seed",) if not flower else FLOWER_KEYS + (OWN_FLOWER_KEYS if own else ()))
    for key in keys:
        _add_key(p, key)
    if flower:
        p.add_argument("--run-config", default="", metavar='"KEY=VALUE ..."',
                       help="more run-config keys in flwr's syntax, checked against the schema before Flower "
                            "is called")


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")
    return text.lower() == "true"


def _estimator(cfg: dict, privacy, callback):
    """The in-process estimator with every model key of ``cfg`` (a parsed run config)."""
    from flower_vfl import VerticalADMM
    return VerticalADMM(loss=cfg["loss"], penalty=cfg["penalty"], lam=cfg["lam"],
                        rho=cfg["rho"] if cfg["rho"] > 0 else "auto", alpha=cfg["alpha"],
                        fit_intercept=cfg["fit-intercept"], max_rounds=cfg["max-rounds"], tol=cfg["tol"],
                        privacy=privacy, verbose=True, acceleration=cfg["acceleration"], x_solver=cfg["x-solver"],
                        variant=cfg["variant"], party_model=cfg.get("party-model", "linear"),
                        label_epsilon=cfg["label-epsilon"] or None, callback=callback)


def cmd_fit(args):
    from flower_vfl.io.data import labels, party_block
    from flower_vfl.reporting.report import write_report

    rc = _run_config(args, "fit")
    party = _party_flags(args)
    if getattr(args, "party", None):     # own data: party files aligned on their IDs
        from flower_vfl.cli.checks import check_label_values
        from flower_vfl.cli.own import own_blocks
        train, y, test, yt, info = own_blocks(args)
        pres, ids = info.pop("_preprocessors"), info.pop("_ids")
        n = len(train)
        cfg = parse_run_config(dict(rc, **{"num-parties": n}))
        check_label_values(y, cfg["loss"], f"the label owner's file {args.labels} (--labels)")
        if yt is not None:
            check_label_values(yt, cfg["loss"], f"the label owner's held-out file {args.labels_test} (--labels-test)")
    else:
        cfg = parse_run_config(rc)
        n = cfg["num-parties"]
        blocks = [party_block(cfg["dataset"], m, n, cfg["data-dir"] or None) for m in range(n)]
        (y, yt), info = labels(cfg["dataset"], cfg["data-dir"] or None), {}
        train, test = [b[0] for b in blocks], [b[1] for b in blocks]
    privacy = None
    if cfg["dp"]:
        nodes = local_node_configs(dict(rc, **party), n)
        seed = {"dp-seed": party["dp-seed"]} if "dp-seed" in party else {}
        privacy = [privacy_from_config(m, {}, {**nodes[m], **seed}, n_rows=train[m].shape[0]) if len(nodes[m]) > 1
                   else None
                   for m in range(n)]
        fitted = [m for m in range(n) if getattr(args, "party", None) and privacy[m] is not None
                  and pres[m].kind != "none"]
        if fitted:      # the party's refusal on its own node (psi_party.refuse_fitted_preprocessing)
            raise ConfigError(f"--preprocess={pres[fitted[0]].kind!r} with --dp: private party {fitted[0]}'s "
                              "columns would be scaled by statistics fitted on its aligned training rows, so one "
                              "person changes every row and no release would be within its calibrated "
                              "sensitivity; drop --preprocess (rows are scaled to unit norm anyway), or scale "
                              "the files' columns by fixed constants that are not computed from their rows")
    if cfg["eval-every"] and cfg["dp"]:
        raise ConfigError("--eval-every with --dp: every intermediate evaluation would be one more privacy "
                          "release of the private parties; drop --eval-every (the final evaluation is budgeted)")
    if cfg["eval-every"] and test is None:
        raise ConfigError("--eval-every needs held-out rows: give --labels-test and one --party-test per --party")
    model = _estimator(cfg, privacy, _eval_callback(cfg["eval-every"], test, yt))
    t0 = time.perf_counter()
    import warnings
    from flower_vfl.privacy.outcome import PrivatePartyHurts
    with warnings.catch_warnings():     # said once below, in the CLI's words (the test loss when there is one)
        warnings.simplefilter("ignore", PrivatePartyHurts)
        model.fit(train, y)
    final = dict(model.history_[-1], wall_time_s=time.perf_counter() - t0, converged=model.converged_, **info)
    if info:
        final["train_score"] = model.score(train, y)
    from flower_vfl.core.losses import get_loss
    # test labels are scored with the plain loss (label DP trains on a corrected loss)
    metric = get_loss(cfg["loss"]) if model.loss_.name == "logistic_rr" else model.loss_
    if test is not None:
        f, t = model.decision_function(test), metric.encode_labels(yt)
        final.update(held_out_metrics(metric, f, t))
    shown = ("n_aligned", "n_owner", "widths", "round", "objective", "train_score", "test_loss", "test_accuracy",
             "test_r2")
    print(json.dumps({k: final[k] for k in shown if k in final}))
    from flower_vfl.privacy.outcome import FIX_API, FIX_CLI, dp_hurts_message
    msg = None
    if getattr(model, "nonprivate_coef_", None) is not None and test is not None:
        ref = metric.mean(model.decision_function_nonprivate(test), t)
        final["test_loss_nonprivate"] = ref
        msg = dp_hurts_message(final["test_loss"], ref, measured="test loss", fix=FIX_CLI)
    elif getattr(model, "dp_warning_", None):       # no held-out rows: the estimator's training-loss check
        msg = model.dp_warning_.replace(FIX_API, FIX_CLI)
    if msg:
        final["dp_warning"] = msg
        print("warning: " + final["dp_warning"], file=sys.stderr)
    privacy_report = model.privacy_report()
    if privacy_report:
        print_privacy_summary(privacy_report)
    if cfg["out-dir"]:
        written = []
        report_rc = dict(rc, data=own_files(args)) if info else rc
        write_report(cfg["out-dir"], report_rc, model.history_, final,
                     extra={"engine": "in-process", "privacy": privacy_report,
                            "party_models": {str(m): b.describe()
                                             for m, b in enumerate(getattr(model, "party_models_", None) or [])}},
                     key="out-dir", written=written)
        if info:                           # own data: the estimator, for `flower-vfl model show`
            written.append(model.save(Path(cfg['out-dir']) / 'model.npz'))
        print(f"wrote {cfg['out-dir']}/: " + ", ".join(Path(p).name for p in written))
    elif not (info and cfg["model-dir"]):
        print("wrote no files (give --out-dir DIR for report.json, metrics.csv, run.png and report.html)")
    if info and (cfg["model-dir"] or cfg["out-dir"]):   # and the files `flower-vfl predict --model-dir` reads
        from flower_vfl.cli.own import save_flower_model
        model_dir = cfg["model-dir"] or cfg["out-dir"]
        save_flower_model(model_dir, model, train, pres, ids, cfg["loss"], dict(rc, data=own_files(args)))
        print(f"wrote {model_dir}/label-owner.npz and party-0..{n - 1}.npz (flower-vfl predict --model-dir "
              f"{model_dir})")
    return 0


def held_out_metrics(metric, f, t) -> dict:
    """The held-out metrics of decisions ``f`` against encoded labels ``t``: the loss, and the
    accuracy for a classification loss or R² (scikit-learn's ``r2_score``) for 'squared'."""
    out = {"test_loss": metric.mean(f, t)}
    if metric.name == "squared":
        from sklearn.metrics import r2_score
        out["test_r2"] = float(r2_score(np.asarray(t).ravel(), np.asarray(f).ravel()))
    else:
        out["test_accuracy"] = float(np.mean(metric.predict(f) == metric.predict(t)))
    return out


def own_files(args) -> str:
    """The report's ``data`` entry of an own-data run: the files it read (not a bundled dataset)."""
    parts = [f"--labels {absolute(args.labels)}", *(f"--party {absolute(p)}" for p in args.party)]
    if getattr(args, "labels_test", ""):
        parts += [f"--labels-test {absolute(args.labels_test)}",
                  *(f"--party-test {absolute(p)}" for p in args.party_test or [])]
    return "own files: " + " ".join(parts)


def _eval_callback(every, test_blocks, y_test):
    """``--eval-every k``: test_loss / test_accuracy in the history every k rounds (refused with
    private parties: an evaluation before training ends would be one more release)."""
    if not every:
        return None

    def callback(k, model):
        if k % every == 0:
            f = model.decision_function(test_blocks)
            model.history_[-1].update(held_out_metrics(model.loss_, f, model.loss_.encode_labels(y_test)))
    return callback


def cmd_report(args):
    """One run's PNG (default RUN_DIR/run.png) or several runs overlaid (--out)."""
    from flower_vfl.reporting.plots import plot_run, plot_runs
    if len(args.run_dirs) == 1 and not args.out:
        path = plot_run(args.run_dirs[0])
    else:
        path = plot_runs(args.run_dirs, args.out or "runs.png")
    print(f"wrote {path}")
    return 0


def local_node_configs(rc: dict, n: int) -> dict[int, dict]:
    """Each party's own settings when one operator plays every party (``fit``, ``simulate``,
    ``deploy-local``): ``--data-dir`` (a party reads its columns from its node config's folder
    only) and, for the private parties, ``dp=true`` and the ``--dp-*`` flags (a party's privacy
    settings come only from its node config; never ``dp-seed``, which a party refuses). Unknown
    ids in ``--dp-parties`` are an error."""
    from flower_vfl.config.settings import dp_party_ids
    nodes = {m: {"partition-id": m} for m in range(n)}
    if rc.get("data-dir"):
        for m in nodes:
            nodes[m]["data-dir"] = rc["data-dir"]
    if rc.get("dp"):
        for m in dp_party_ids(rc, n):
            nodes[m].update({"dp": True, "dp-epsilon": SCHEMA["dp-epsilon"].default,   # --dp: the flags' budget
                             **{k: rc[k] for k in PARTY_FLAGS if k in rc}})
    return nodes


def print_privacy_summary(reports):
    print("privacy (each party's own ledger; ε from the accountants over the noise drawn):")
    for r in reports:
        cfg, tot = r["config"], r["totals"]
        led = r["ledger"]["entries"]
        if "label_epsilon" in cfg:      # the label owner's randomized response (pure ε)
            e = led[0] if led else {}
            print(f"  label owner: {r['mechanism']} ({e.get('labels', '?')} labels, flip probability "
                  f"{e.get('flip_probability', float('nan')):.4g}); ε spent: "
                  + ", ".join(f"{k}={v:.4g}" for k, v in tot.items()))
            continue
        sig = sorted({round(e["sigma"], 6) for e in led})
        print(f"  party {r['party_id']}: budget (ε={cfg['epsilon']}, δ={cfg['delta']}), calibration="
              f"{cfg['calibration']} [{r['neighbouring_relation']}]")
        print(f"    releases={len(led)} (train {sum(e['kind'] == 'train' for e in led)}, eval "
              f"{sum(e['kind'] == 'eval' for e in led)}), noise multiplier z={r['noise_multiplier']:.4g}, "
              f"σ∈{sig[:3]}{'…' if len(sig) > 3 else ''}")
        print("    ε spent: " + ", ".join(f"{k}={v:.4g}" for k, v in tot.items()))
        from flower_vfl.reporting.notes import paper_inf_note
        if paper_inf_note(tot):
            print("    (" + paper_inf_note(tot) + ")")


#: tries of a simulate job whose Ray node did not start (flower_vfl.deploy.local.ray_did_not_start):
#: one retry, said in one line
SIMULATE_ATTEMPTS = 2


def simulation_federation(num_parties: int) -> str:
    """The simulation's federation config: ``num_parties`` SuperNodes and one ClientApp CPU, with Ray
    given ``min(cores, parties)`` CPUs, so up to that many Ray actors run the parties' x-updates of a
    round side by side (Flower's default of 2 CPUs a ClientApp runs them one after the other on a
    2-core machine: docs/benchmarks.md, "Flower per-round vs round trip")."""
    cpus = max(1, min(os.cpu_count() or 1, int(num_parties)))
    return f"num-supernodes={num_parties} client-resources-num-cpus=1 init-args-num-cpus={cpus}"


def cmd_simulate(args):
    rc = _run_config(args, None if getattr(args, "mode", "train") == "predict" else "simulate")
    if rc.get("mode") == "predict" and not getattr(args, "party", None):
        raise ConfigError("flower-vfl predict needs the files: --labels (the IDs to score) and one --party per party")
    flags = _party_flags(args)
    if getattr(args, "party", None):     # own data: each party's files become its node config
        from flower_vfl.cli.own import own_node_configs
        rc, nodes, _ = own_node_configs(args, rc, lambda n: local_node_configs(dict(rc, **flags), n))
    else:
        nodes = local_node_configs(dict(rc, **flags), int(rc.get("num-parties", RUN_DEFAULTS["num-parties"])))
    num_parties = len(nodes)
    items = []
    for k, v in rc.items():
        items.append(f"{k}={json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else v}")
    # Flower's simulation engine on a SuperLink of this job's own (flower_vfl.deploy.local.simulation_superlink:
    # a free port, its own FLWR_HOME, no runtime dependency installation, stopped when the job ends), in a
    # private folder of this job: the simulated parties' node configs (flower_vfl.apps.client reads the file
    # named by FLOWER_VFL_NODE_CONFIG at every message), the SuperLink's and the run's logs. Flower's shared
    # local SuperLink would keep the environment of the run that started it, on fixed ports.
    import shutil
    import tempfile

    from flower_vfl.cli.app import app_dir
    from flower_vfl.cli.job import FoldTracebacks, output_note, ray_env, written_note
    from flower_vfl.deploy import local
    t_start = time.monotonic()
    predict = rc.get("mode") == "predict"
    if not predict:
        print(output_note(rc.get("out-dir", ""), rc.get("model-dir", "")))
    workdir = Path(tempfile.mkdtemp(prefix="flower-vfl-simulate-"))
    path = workdir / "node-config.json"
    own = any(len(cfg) > 1 for cfg in nodes.values())       # folders, privacy settings or own-data files
    path.write_text(json.dumps({str(m): cfg for m, cfg in nodes.items()} if own else {}))
    if own:
        print(f"the simulated parties' node configs: {path} (FLOWER_VFL_NODE_CONFIG)")
    # `flwr run --stream` exits 0 even when the ServerApp failed: submit, stream the log, then read the
    # run's status from Flower and exit non-zero unless it completed, naming the error the log shows.
    # The Flower app is the one shipped in the package (flower_vfl.cli.app): any working folder
    run_config = " ".join(items).replace('"', "'")
    app = app_dir()
    federation = simulation_federation(num_parties)
    print(f"flwr run {app} --federation-config \"{federation}\" --run-config \"{run_config}\"")
    # Ray's own time-outs, longer for a loaded machine (flower_vfl.cli.job.RAY_LOADED_MACHINE), unless set
    env = {"FLOWER_VFL_NODE_CONFIG": str(path), **ray_env(os.environ)}
    folded = 0
    for attempt in range(1, SIMULATE_ATTEMPTS + 1):
        log_path = workdir / "logs" / f"run{'' if attempt == 1 else attempt}.log"
        try:
            link = local.simulation_superlink(workdir, env).__enter__()
        except RuntimeError as exc:        # the SuperLink did not start (its log named): one line, not a traceback
            print(f"flower-vfl: error: {exc}\n  (this job's folder, kept: {workdir})", file=sys.stderr)
            return 1
        with contextlib.ExitStack() as stack:
            stack.push(link.__exit__)
            warm = getattr(link, "warm_flwr", None)        # Flower's CLI, imported while the SuperLink started
            try:
                run_id = local.submit(app, link.connection, run_config, link.env, federation_config=federation,
                                      **({"warm": warm} if warm is not None else {}))
            except RuntimeError as exc:    # `flwr run` refused the job (Flower's message): one line
                print(f"flower-vfl: error: {exc}\n  (this job's folder, kept: {workdir})", file=sys.stderr)
                return 1
            # the log's lines on stdout as they come (each traceback folded to one line, the whole log kept
            # in this job's folder), the rounds' bar under them on stderr
            shown = FoldTracebacks(sys.stdout, log_path)
            with local.RoundProgress(_max_rounds(rc), echo=shown) as progress:
                record = local.wait_run(run_id, link.connection, link.env, log_path, echo=progress,
                                        on_line=progress)
            shown.close()
            folded += shown.folded
        record.setdefault("run-id", run_id)
        if not (local.exit_code(record) and local.ray_did_not_start(record)) or attempt == SIMULATE_ATTEMPTS:
            break
        # Ray (Flower's simulation engine) gives its node a fixed 30 s to start; on a loaded machine it may
        # not, before any ClientApp ran (so no party released anything): start the job again, once
        print(f"run {run_id}: Ray's node did not start within its 30 s (load {os.getloadavg()[0]:.1f}); "
              f"starting the job again (attempt {attempt + 1} of {SIMULATE_ATTEMPTS})", file=sys.stderr)
    code = local.exit_code(record)
    print(f"run {run_id}: {record.get('status')}"
          + (f" ({record['status-details']})" if record.get("status-details", "N/A") != "N/A" else "")
          + f" in {time.monotonic() - t_start:.0f} s")
    if code:
        print("flower-vfl: error: " + cli_words(local.failure_message(record), getattr(args, "_flags", set()))
              + f"\n  (this job's folder, kept: {workdir})", file=sys.stderr)
        return code
    if not predict:
        print(written_note(rc.get("out-dir", ""), rc.get("model-dir", "")) or "wrote no files (no --out-dir)")
    if folded:
        print(f"({folded} traceback(s) folded above; the job's full logs are kept in {workdir / 'logs'})")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


def _max_rounds(rc: dict) -> int:
    """The run's ``max-rounds`` (the progress bar's length; a converged run ends it earlier)."""
    return int(rc.get("max-rounds", SCHEMA["max-rounds"].default))


def _pin_secagg_keys(nodes: dict, folder: Path) -> None:
    """``deploy-local`` with ``secagg=true``: each SuperNode gets an Ed25519 signing key of its own
    (``folder/party<m>.pem``, mode 0600) and pins every other party's public key, as two
    institutions would (docs/secagg.md); without pins a deployed SuperNode refuses secure sums."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from flower_vfl.secagg import public_key_hex, signing_key_pem
    folder.mkdir(parents=True, exist_ok=True)
    keys = {m: Ed25519PrivateKey.generate() for m in nodes}
    for m, cfg in nodes.items():
        path = folder / f"party{m}.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(signing_key_pem(keys[m]))
        cfg["secagg-signing-key"] = str(path.resolve())
        cfg["secagg-pins"] = ", ".join(f"party{j}={public_key_hex(keys[j])}" for j in nodes if j != m)


def cmd_deploy_local(args):
    """SuperLink + one SuperNode per party on loopback (TLS, registered keys bound to parties),
    one job, the report collected, every process started stopped; non-zero unless it completed."""
    from flower_vfl.cli.app import app_dir
    from flower_vfl.deploy.local import RoundProgress, deploy_local
    rc = _run_config(args, "deploy-local")
    flags = _party_flags(args)
    if getattr(args, "party", None):     # own data: each party's files become its SuperNode's node config
        from flower_vfl.cli.own import own_node_configs
        rc, nodes, n = own_node_configs(args, rc, lambda k: local_node_configs(dict(rc, **flags), k))
    else:
        n = int(rc.get("num-parties", RUN_DEFAULTS["num-parties"]))
        nodes = local_node_configs(dict(rc, **flags), n)
    if rc.get("secagg") is True:          # one operator holds every party here: it pins their keys itself
        _pin_secagg_keys(nodes, Path(args.workdir) / "secagg")
    with RoundProgress(_max_rounds(rc), echo=sys.stdout) as progress:      # the rounds as they happen
        res = deploy_local(args.workdir, n, rc, node_configs={m: {k: v for k, v in cfg.items() if k != "partition-id"}
                                                              for m, cfg in nodes.items()},
                           app_dir=app_dir(), tls=not args.insecure, auth=not args.insecure, timeout=args.timeout,
                           isolation=args.isolation, idle_poll=args.idle_poll or None, echo=progress,
                           on_line=progress)
    rec = res["record"]
    print(f"run {res['run_id']}: {rec.get('status')}"
          + (f" ({rec['status-details']})" if rec.get("status-details", "N/A") != "N/A" else ""))
    print(f"report: {res['out_dir']}/report.json; logs: {res['logs']}")
    return res["exit_code"]


def cmd_superlink(args):
    """``flower-vfl superlink list|stop``: the SuperLinks this package started (``simulate``,
    ``deploy-local``), from the per-user registry (flower_vfl.deploy.local.superlink_registry);
    ``stop`` signals a recorded process group only, never a process found by its name."""
    from flower_vfl.deploy import local
    running = local.recorded_superlinks()
    if args.action == "list":
        if not running:
            print(f"no SuperLink started by flower-vfl is running (registry: {local.superlink_registry()})")
        for r in running:
            print(f"pid {r['pid']}  port {r['port']}  {r['command']}  since {r['started_at']}  FLWR_HOME {r['flwr_home']}"
                  f"  log {r['log']}")
        shared = _shared_local_superlink()
        if shared:
            print(f"also: Flower's shared local SuperLink answers on {shared} (started by a `flwr run` with a "
                  "':local:' connection, not by flower-vfl, which has no record of its PID and does not stop it; "
                  "it keeps the settings of the run that started it)")
        return 0
    if not args.pid and not args.all:
        raise ConfigError("flower-vfl superlink stop needs the PID `flower-vfl superlink list` shows, or --all")
    targets = running if args.all else [r for r in running if int(r["pid"]) in args.pid]
    missing = [] if args.all else sorted(set(args.pid) - {int(r["pid"]) for r in running})
    if missing:
        raise ConfigError(f"no running SuperLink started by flower-vfl has pid {', '.join(map(str, missing))} "
                          f"(`flower-vfl superlink list` shows them; registry {local.superlink_registry()})")
    for r in targets:
        local.stop_recorded_superlink(int(r["pid"]))
        print(f"stopped SuperLink pid {r['pid']} (port {r['port']}, {r['command']})")
    if not targets:
        print("no SuperLink started by flower-vfl is running")
    return 0


def _shared_local_superlink() -> str:
    """The address of Flower's shared local SuperLink when one answers (FLWR_LOCAL_SUPERLINK_HTTP_API_PORT,
    default 39091), else ''."""
    import urllib.request
    addr = f"127.0.0.1:{os.environ.get('FLWR_LOCAL_SUPERLINK_HTTP_API_PORT', '39091')}"
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=1) as res:
            return addr if res.status == 200 else ""
    except OSError:
        return ""


def cmd_epsilon(args):
    from flower_vfl.cli.checks import check_epsilon_args
    from flower_vfl.privacy import available_methods, epsilon_spent
    check_epsilon_args(args)
    for method in available_methods():
        print(f"{method:>6}: ε = {epsilon_spent(args.noise_multiplier, args.rounds, args.delta, method):.4f}")
    return 0


def cmd_audit(args):
    from flower_vfl.io.data import labels, party_block
    from flower_vfl.estimator.audit import audit_private_run
    from flower_vfl.privacy.party import PrivacyConfig
    from flower_vfl.cli.checks import check_audit_args

    check_audit_args(args)
    n = args.num_parties
    blocks = [party_block(args.dataset, m, n, args.data_dir or None)[0] for m in range(n)]
    y, _ = labels(args.dataset, args.data_dir or None)
    if args.rows and args.rows < y.size:
        idx = np.random.default_rng(0).choice(y.size, args.rows, replace=False)
        blocks, y = [b[idx] for b in blocks], y[idx]
    cfg = PrivacyConfig(epsilon=1.0, train_rounds=args.rounds, b1=args.b1, c_v=args.clip, c_s=args.clip,
                        calibration=args.relation, seed=0)
    privacy = [cfg if m == args.party else None for m in range(n)]
    kw = {"variant": "paper", "rho": args.rho} if args.relation == "paper" else {}
    res = audit_private_run(blocks, y, args.party, args.lam, privacy, rounds=args.rounds,
                            relation=args.relation, n_random=args.n_random, n_climb=args.n_climb, **kw)
    print(json.dumps(res.to_dict(), default=float, indent=2))
    print("VIOLATION: a neighbour exceeds C" if res.max_ratio > 1 else "no neighbour exceeded C")
    return 0


def main(argv=None):
    from flower_vfl.cli.checks import CLIParser, parser_flags
    from flower_vfl.cli.own import add_own_args, cmd_model_show
    # no abbreviated flags (--max-round is not --max-rounds): every sub-command's parser is a CLIParser too
    ap = CLIParser(prog="flower-vfl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("fit", help="in-process engine (progress bar, report.json + metrics.csv)")
    _add_run_args(p, flower=False)
    add_own_args(p, fit=True)
    p.set_defaults(fn=cmd_fit)
    p = sub.add_parser("simulate", help="the same run in Flower's simulation engine (flwr run)")
    _add_run_args(p, own=True)
    add_own_args(p)
    p.set_defaults(fn=cmd_simulate)
    p = sub.add_parser("predict", help="score new rows with the saved model: a Flower job (mode=predict)")
    _add_run_args(p, predict=True)
    add_own_args(p, predict=True)
    p.set_defaults(fn=cmd_simulate, mode="predict")
    p = sub.add_parser("model", help="a saved model file's metadata: flower-vfl model show PATH")
    p.add_argument("action", choices=["show"])
    p.add_argument("path")
    p.set_defaults(fn=cmd_model_show)
    p = sub.add_parser("deploy-local", help="SuperLink + SuperNodes on loopback with TLS and node keys, one job")
    _add_run_args(p, own=True)
    add_own_args(p)
    p.add_argument("--workdir", default="runs/deploy-local", help="certificates, keys, logs, out/ (report)")
    p.add_argument("--insecure", action="store_true", help="no TLS and no SuperNode authentication")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the run")
    p.add_argument("--isolation", choices=("warm", "subprocess"), default="warm",
                   help="warm: each message's ClientApp forked from a warm interpreter (default, "
                        "~3x faster rounds); subprocess: Flower's default, a new interpreter per message")
    p.add_argument("--idle-poll", type=float, default=0.5,
                   help="seconds an idle SuperNode waits between pulls (flower-vfl-supernode; "
                        "0 = Flower's flower-supernode as shipped, which sleeps 3 s)")
    p.set_defaults(fn=cmd_deploy_local)
    __import__("flower_vfl.cli.ledger", fromlist=["add_parser"]).add_parser(sub)   # flower_vfl/cli/ledger.py
    p = sub.add_parser("superlink", help="list or stop the SuperLinks flower-vfl started (simulate, deploy-local)")
    p.add_argument("action", choices=["list", "stop"])
    p.add_argument("pid", nargs="*", type=int, help="stop: the PIDs `flower-vfl superlink list` shows")
    p.add_argument("--all", action="store_true", help="stop: every SuperLink flower-vfl started that still runs")
    p.set_defaults(fn=cmd_superlink)
    p = sub.add_parser("epsilon", help="ε of T Gaussian releases by every accountant")
    p.add_argument("--noise-multiplier", type=float, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--delta", type=float, default=1e-5)
    p.set_defaults(fn=cmd_epsilon)
    p = sub.add_parser("audit", help="search neighbouring datasets against a calibration's C")
    p.add_argument("--dataset", default="a9a", choices=["breast_cancer", "a9a"])
    p.add_argument("--num-parties", type=int, default=2)
    p.add_argument("--party", type=int, default=1)
    p.add_argument("--relation", default="strict", choices=["strict", "paper"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", type=int, default=3000, help="subsample rows (0 = all)")
    p.add_argument("--lam", type=float, default=1e-4)
    p.add_argument("--rho", type=float, default=1.0, help="paper relation only (the paper's scale)")
    p.add_argument("--b1", type=float, default=5.0)
    p.add_argument("--clip", type=float, default=2.0)
    p.add_argument("--n-random", type=int, default=10)
    p.add_argument("--n-climb", type=int, default=15)
    p.add_argument("--data-dir", default="")
    p.set_defaults(fn=cmd_audit)
    __import__("flower_vfl.cli.report", fromlist=["add_parser"]).add_parser(sub)   # flower_vfl/cli/report.py
    __import__("flower_vfl.cli.certs", fromlist=["add_parser"]).add_parser(sub)    # flower_vfl/cli/certs.py
    args = ap.parse_args(argv)
    flags = parser_flags(ap, args.cmd)        # errors name this command's flags, not config keys
    args._flags = flags
    try:
        return args.fn(args)
    except ConfigError as exc:       # a bad value: the key and what is allowed, no traceback
        ap.exit(2, f"flower-vfl: error: {cli_words(str(exc), flags)}\n")
    except UserError as exc:         # bad data, a refusal, a missing party: one line (flower_vfl.errors)
        ap.exit(1, f"flower-vfl: error: {type(exc).__name__}: {cli_words(str(exc), flags)}\n")


if __name__ == "__main__":
    sys.exit(main())
