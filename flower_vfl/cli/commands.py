"""``flower-vfl``: run the in-process engine or the Flower simulation, account and audit privacy.

    flower-vfl fit --dataset breast_cancer --num-parties 3 --out-dir runs/demo
    flower-vfl fit --dataset a9a --num-parties 2 --dp --dp-epsilon 1 --dp-parties 1 --dp-lam 3e-3
    flower-vfl simulate --dataset a9a --num-parties 2 --max-rounds 20 --out-dir runs/flwr
    flower-vfl epsilon --noise-multiplier 10 --rounds 20 --delta 1e-5
    flower-vfl audit --dataset a9a --party 1 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from flower_vfl.config.settings import RUN_DEFAULTS, privacy_from_config
from flower_vfl.config.schema import SCHEMA, ConfigError, parse_run_config
from flower_vfl.cli.own import absolute
from flower_vfl.errors import UserError


#: run-config keys that name a file or folder: made absolute on the command line, since the
#: ServerApp and ClientApps they reach run in Flower's processes, from another working directory
PATH_KEYS = ("out-dir", "resume", "party-keys", "data-dir", "state-dir", "labels-path", "labels-test-path",
             "score-ids-path", "model-dir", "predictions-path")


def _run_config(args) -> dict:
    rc = {}
    for key in RUN_DEFAULTS:
        attr = key.replace("-", "_")
        if hasattr(args, attr) and getattr(args, attr) is not None:
            rc[key] = getattr(args, attr)
    parse_run_config(rc, source="command line")     # every value checked before any round
    for key in PATH_KEYS:
        if isinstance(rc.get(key), str):
            rc[key] = absolute(rc[key])
    return rc


def _add_run_args(p):
    p.add_argument("--dataset", default="breast_cancer", choices=["breast_cancer", "a9a"])
    p.add_argument("--num-parties", type=int, default=2)
    p.add_argument("--loss", default="logistic")
    p.add_argument("--penalty", default="l2")
    p.add_argument("--lam", type=float, default=1e-4)
    p.add_argument("--rho", type=float, default=0.0, help="0 = the default: 0.2*c/N for L2, 0.2*c/(8N) for l1/elasticnet, 3*c/N for nonconvex losses")
    p.add_argument("--max-rounds", type=int, default=50)
    p.add_argument("--tol", type=float, default=0.0)
    p.add_argument("--data-dir", default="")
    p.add_argument("--out-dir", default="")
    p.add_argument("--dp", action="store_true", help="private parties (strict calibration)")
    p.add_argument("--dp-parties", default="", help="e.g. '1' (default: all parties)")
    p.add_argument("--dp-epsilon", type=float, default=1.0)
    p.add_argument("--dp-delta", type=float, default=1e-5)
    p.add_argument("--dp-calibration", default="strict", choices=["strict", "paper"])
    p.add_argument("--dp-accountant", default="exact")
    p.add_argument("--dp-train-rounds", type=int, default=0,
                   help="released training rounds per private party after the warm start (0: only "
                        "the evaluation release; see docs/privacy.md)")
    p.add_argument("--dp-eval-rounds", type=int, default=1)
    p.add_argument("--dp-lam", type=float, default=0.0,
                   help="the private party's own L2 coefficient (0: --lam); larger = less noise, more bias")
    p.add_argument("--dp-b1", type=float, default=2.0, help="ball radius of x_m (rows are normalized)")
    p.add_argument("--dp-clip", type=float, default=10.0,
                   help="clip of the x-update target and of released values")
    p.add_argument("--dp-seed", type=int, default=-1, help="noise seed (-1: fresh OS entropy)")
    for key, spec in SCHEMA.items():     # every other run key, typed by the schema
        if spec.scope != "node" and spec.type is not object and f"--{key}" not in p._option_string_actions:
            p.add_argument(f"--{key}", type=_bool if spec.type is bool else spec.type, default=None,
                           choices=spec.choices, help=spec.help.replace("%", "%%"))


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")
    return text.lower() == "true"


def cmd_fit(args):
    from flower_vfl import VerticalADMM
    from flower_vfl.io.data import labels, party_block
    from flower_vfl.reporting.report import write_report

    rc = _run_config(args)
    if getattr(args, "party", None):     # own data: party files aligned on their IDs
        from flower_vfl.cli.own import fit_own
        return fit_own(args, rc)
    n = args.num_parties
    blocks = [party_block(args.dataset, m, n, args.data_dir or None) for m in range(n)]
    y, yt = labels(args.dataset, args.data_dir or None)
    nodes = local_node_configs(rc, n)
    privacy = [privacy_from_config(m, {}, nodes[m]) for m in range(n)] if args.dp else None
    model = VerticalADMM(loss=args.loss, penalty=args.penalty, lam=args.lam,
                         rho=args.rho if args.rho > 0 else "auto", max_rounds=args.max_rounds,
                         tol=args.tol, privacy=privacy, verbose=True,
                         acceleration=str(rc.get("acceleration", "auto")), x_solver=str(rc.get("x-solver", "auto")),
                         label_epsilon=float(rc.get("label-epsilon", 0.0)) or None,
                         callback=_eval_callback(args, [b[1] for b in blocks], yt))
    t0 = time.perf_counter()
    model.fit([b[0] for b in blocks], y)
    f = model.decision_function([b[1] for b in blocks])
    from flower_vfl.core.losses import get_loss
    # test labels are scored with the plain loss (label DP trains on a corrected loss)
    metric = get_loss(args.loss) if model.loss_.name == "logistic_rr" else model.loss_
    t = metric.encode_labels(yt)
    final = dict(model.history_[-1], test_loss=metric.mean(f, t),
                 test_accuracy=float(np.mean(metric.predict(f) == metric.predict(t))),
                 wall_time_s=time.perf_counter() - t0, converged=model.converged_)
    print(json.dumps({k: final[k] for k in ("round", "objective", "test_loss", "test_accuracy")}))
    if getattr(model, "nonprivate_coef_", None) is not None:
        ref = metric.mean(model.decision_function_nonprivate([b[1] for b in blocks]), t)
        final["test_loss_nonprivate"] = ref
        if final["test_loss"] > ref:
            final["dp_warning"] = (
                f"the private parties made the model worse: test loss {final['test_loss']:.4g} with them vs "
                f"{ref:.4g} for the non-private parties alone; raise --dp-lam, lower --dp-train-rounds or "
                "give them a larger --dp-epsilon")
            print("warning: " + final["dp_warning"], file=sys.stderr)
    privacy_report = model.privacy_report()
    if privacy_report:
        print_privacy_summary(privacy_report)
    if args.out_dir:
        path = write_report(args.out_dir, rc, model.history_, final,
                            extra={"engine": "in-process", "privacy": privacy_report})
        print(f"wrote {path} and metrics.csv")
    return 0


def _eval_callback(args, test_blocks, y_test):
    """``--eval-every k``: test_loss / test_accuracy in the history every k rounds (not with
    private parties: an evaluation before training ends would be one more release)."""
    every = int(getattr(args, "eval_every", None) or 0)
    if every <= 0 or args.dp:
        if every > 0:
            print("--eval-every is ignored with --dp: intermediate evaluations would be privacy releases")
        return None

    def callback(k, model):
        if k % every == 0:
            f = model.decision_function(test_blocks)
            t = model.loss_.encode_labels(y_test)
            model.history_[-1].update(test_loss=model.loss_.mean(f, t),
                                      test_accuracy=float(np.mean(model.loss_.predict(f) == model.loss_.predict(t))))
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
    """Each party's own settings when one operator plays every party (``fit``, ``simulate``):
    the ``--dp-*`` flags become the private parties' node configs (a party's privacy settings
    come only from its node config). Unknown ids in ``--dp-parties`` are an error."""
    from flower_vfl.config.settings import PRIVACY_KEYS, dp_party_ids
    nodes = {m: {"partition-id": m} for m in range(n)}
    if rc.get("dp"):
        for m in dp_party_ids(rc, n):
            nodes[m].update({"dp": True, **{k: rc[k] for k in PRIVACY_KEYS if k in rc}})
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


def cmd_simulate(args):
    rc = _run_config(args)
    nodes = local_node_configs(rc, args.num_parties)
    if getattr(args, "party", None):     # own data: each party's files become its node config
        from flower_vfl.cli.own import own_node_configs
        rc, nodes, args.num_parties = own_node_configs(args, rc, nodes)
    items = []
    for k, v in rc.items():
        items.append(f"{k}={json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else v}")
    env = dict(os.environ, FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    # The simulated parties' own settings, as their node configs (flower_vfl.apps.client reads the
    # file at every message). One stable path, rewritten every time: a local SuperLink started
    # by an earlier run keeps that run's environment, so a fresh temporary path would go stale.
    from pathlib import Path
    path = Path(os.environ.get("FLOWER_VFL_NODE_CONFIG") or Path.home() / ".flower-vfl" / "simulate-node-config.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    own = any(len(cfg) > 1 for cfg in nodes.values())       # privacy settings or own-data files
    path.write_text(json.dumps({str(m): cfg for m, cfg in nodes.items()} if own else {}))
    env["FLOWER_VFL_NODE_CONFIG"] = str(path)
    if own:
        print(f"the simulated parties' node configs: {path} (FLOWER_VFL_NODE_CONFIG)")
    # `flwr run --stream` exits 0 even when the ServerApp failed: submit, stream the log, then
    # read the run's status from Flower (flower_vfl.deploy.local) and exit non-zero unless it completed
    from flower_vfl.deploy.local import exit_code, submit, wait_run
    run_config = " ".join(items).replace('"', "'")
    print(f"flwr run . --federation-config num-supernodes={args.num_parties} --run-config \"{run_config}\"")
    run_id = submit(".", None, run_config, env, federation_config=f"num-supernodes={args.num_parties}")
    record = wait_run(run_id, None, env)
    print(f"run {run_id}: {record.get('status')}"
          + (f" ({record['status-details']})" if record.get("status-details", "N/A") != "N/A" else ""))
    return exit_code(record)


def cmd_deploy_local(args):
    """SuperLink + one SuperNode per party on loopback (TLS, registered keys bound to parties),
    one job, the report collected, every process started stopped; non-zero unless it completed."""
    from flower_vfl.deploy.local import deploy_local
    rc = _run_config(args)
    data = {"data-dir": rc["data-dir"]} if rc.get("data-dir") else {}
    res = deploy_local(args.workdir, args.num_parties, rc, node_configs={m: dict(data) for m in range(args.num_parties)},
                       tls=not args.insecure, auth=not args.insecure, timeout=args.timeout,
                       isolation=args.isolation, idle_poll=args.idle_poll or None)
    rec = res["record"]
    print(f"run {res['run_id']}: {rec.get('status')}"
          + (f" ({rec['status-details']})" if rec.get("status-details", "N/A") != "N/A" else ""))
    print(f"report: {res['out_dir']}/report.json; logs: {res['logs']}")
    return res["exit_code"]


def cmd_ledger(args):
    """Every dataset this party's store has released on: budget, releases per run, ε spent
    (the party's accountant over the noise multipliers it recorded), what is left."""
    import shlex
    from pathlib import Path

    from flower_vfl.privacy.accounting import epsilon_for_releases
    from flower_vfl.privacy.store import PartyStore, default_state_dir
    state = args.state_dir
    if args.node_config:
        kv = dict(item.split("=", 1) for item in shlex.split(args.node_config) if "=" in item)
        state = state or kv.get("state-dir", "")
    path = Path(state) if state else default_state_dir()
    if not (path / "party.sqlite").is_file() and not path.is_file():
        print(f"flower-vfl ledger: no party store at {path} (no private release was ever made there); "
              "give the party's --state-dir", file=sys.stderr)
        return 2
    store = PartyStore(path)
    out = []
    for fp, unit, count in store.datasets():
        info = store.budget_info(fp, unit) or {}
        entries = store.entries(fp, unit)
        zs = [e.noise_multiplier for e in entries]
        delta, method = info.get("delta", 1e-5), info.get("accountant", "exact")
        spent = epsilon_for_releases(zs, delta, method)
        runs = {}
        for e in entries:
            runs.setdefault(e.run, {"train": 0, "eval": 0})[e.kind] += 1
        out.append({"fingerprint": fp, "unit": unit, "party_id": info.get("party_id"),
                    "budget_epsilon": info.get("epsilon"), "delta": delta, "accountant": method,
                    "releases": count, "runs": runs, "spent_epsilon": spent,
                    "remaining_epsilon": None if info.get("epsilon") is None else max(0.0, info["epsilon"] - spent)})
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"party store {store.path}")
    for d in out:
        print(f"  data {d['fingerprint'][:16]}… ({d['unit']}), party {d['party_id']}: budget ε={d['budget_epsilon']} "
              f"δ={d['delta']:g} ({d['accountant']}); {d['releases']} releases over {len(d['runs'])} run(s); "
              f"spent ε={d['spent_epsilon']:.4g}, left ε={d['remaining_epsilon']:.4g}")
        for run, kinds in d["runs"].items():
            print(f"    run {run}: {kinds['train']} training, {kinds['eval']} model release(s)")
    return 0


def cmd_epsilon(args):
    from flower_vfl.privacy import available_methods, epsilon_spent
    for method in available_methods():
        print(f"{method:>6}: ε = {epsilon_spent(args.noise_multiplier, args.rounds, args.delta, method):.4f}")
    return 0


def cmd_audit(args):
    from flower_vfl.io.data import labels, party_block
    from flower_vfl.estimator.audit import audit_private_run
    from flower_vfl.privacy.party import PrivacyConfig

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
    ap = argparse.ArgumentParser(prog="flower-vfl", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("fit", help="in-process engine (progress bar, report.json + metrics.csv)")
    _add_run_args(p)
    p.set_defaults(fn=cmd_fit)
    p = sub.add_parser("simulate", help="the same run in Flower's simulation engine (flwr run .)")
    _add_run_args(p)
    p.set_defaults(fn=cmd_simulate)
    from flower_vfl.cli.own import add_own_args, cmd_model_show
    add_own_args(sub.choices["fit"])
    add_own_args(p)
    p = sub.add_parser("predict", help="score new rows with the saved model: a Flower job (mode=predict)")
    _add_run_args(p)
    add_own_args(p, predict=True)
    p.set_defaults(fn=cmd_simulate, mode="predict")
    p = sub.add_parser("model", help="a saved model file's metadata: flower-vfl model show PATH")
    p.add_argument("action", choices=["show"])
    p.add_argument("path")
    p.set_defaults(fn=cmd_model_show)
    p = sub.add_parser("deploy-local", help="SuperLink + SuperNodes on loopback with TLS and node keys, one job")
    _add_run_args(p)
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
    p = sub.add_parser("report", help="PNG of one run dir, or several overlaid (e.g. ADMM vs SGD)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="folders with metrics.csv (+ report.json)")
    p.add_argument("--out", default="", help="PNG path (default: RUN_DIR/run.png for one run, runs.png for several)")
    p.set_defaults(fn=cmd_report)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as exc:       # a bad value: the key and what is allowed, no traceback
        ap.exit(2, f"flower-vfl: error: {exc}\n")
    except UserError as exc:         # bad data, a refusal, a missing party: one line (flower_vfl.errors)
        ap.exit(1, f"flower-vfl: error: {type(exc).__name__}: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
