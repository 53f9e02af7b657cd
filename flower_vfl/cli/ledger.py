"""``flower-vfl ledger``: a party's privacy spend on each data source, from its own state-dir.

    flower-vfl ledger --node-config "partition-id=1 state-dir=/srv/party1"
    flower-vfl ledger --state-dir /srv/party1 --json
    flower-vfl ledger --state-dir /srv/party1 --accept-reset
    flower-vfl ledger --state-dir /srv/party1 --release-plan 7

For every source the party's node config ever declared (its files and ID column, or a
bundled dataset and partition: :mod:`flower_vfl.clients.source`): the budget last
configured, the releases per run, the ε spent (the party's accountant over the noise
multipliers it charged, every run and view composed) and what is left, and every plan a run
reserved (:class:`~flower_vfl.privacy.store.Plan`: its runs, status, releases made of planned, the ε
the whole plan spends and what its made releases spent, when it lapses). A reservation held by a
run that died and will not be resumed lapses after the node config's ``dp-plan-expiry``; its
operator can release it at once with ``--release-plan <run>``
(:meth:`~flower_vfl.privacy.store.PartyStore.release_plan`: its made releases stay charged, its
unmade ones are no longer reserved). Then the label
owner's label ledger (:func:`flower_vfl.privacy.label_dp.label_ledger_rows`: one randomized
response per label source, reused by every run) and the PSI log
(:func:`flower_vfl.io.psi_log.psi_log_rows`: distinct IDs asked per source, against the cap).

A ledger that holds fewer releases than its journal (the SQLite file deleted or its WAL
lost) is shown as such, and the party refuses to start until ``--accept-reset`` records
that its operator accepts the loss (:func:`flower_vfl.privacy.store.accept_reset`).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

__all__ = ["add_parser", "cmd_ledger", "ledger_summary"]


def add_parser(sub):
    """Register ``ledger`` on the ``flower-vfl`` command's subparsers."""
    p = sub.add_parser("ledger", help="a party's privacy spend across runs, from its own state-dir")
    p.add_argument("--state-dir", default="", help="the party's state-dir (default: $FLOWER_VFL_STATE_DIR "
                                                   "or the per-user ~/.flower-vfl/party-state of in-process "
                                                   "runs and simulate; a SuperNode names its own)")
    p.add_argument("--node-config", default="", help="or the SuperNode's --node-config string (reads state-dir)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--release-plan", default="", metavar="RUN",
                   help="give up the open reservation of the plan opened by run RUN (shown as 'plan run RUN'): "
                        "its made releases stay charged, its unmade ones are no longer reserved")
    p.add_argument("--accept-reset", action="store_true",
                   help="accept that the party's ledger lost releases its journal names (a deleted SQLite "
                        "file or lost WAL): the old journal is archived and the party may start again")
    p.set_defaults(fn=cmd_ledger)
    return p


def _node_config(args) -> dict:
    """``--node-config``'s keys and values (quoted or not); a key the schema does not know is
    refused, naming it (a typo'd ``state-dir`` would read the per-user default store instead)."""
    import difflib

    from flower_vfl.config.schema import SCHEMA, ConfigError
    kv = dict(item.split("=", 1) for item in shlex.split(args.node_config or "") if "=" in item)
    for key in kv:
        if key not in SCHEMA:
            close = difflib.get_close_matches(key, list(SCHEMA), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown --node-config key {key!r}{hint}; the ledger reads state-dir and "
                              "dp-plan-expiry from the SuperNode's node config")
    return kv


def _state_dir(args) -> Path:
    from flower_vfl.privacy.store import default_state_dir
    state = args.state_dir
    if args.node_config:
        state = state or _node_config(args).get("state-dir", "")
    return Path(state) if state else default_state_dir()


def ledger_summary(store) -> list[dict]:
    """One dict per source in ``store``: what it is, budget, runs, spent and remaining ε."""
    from flower_vfl.privacy.ledger import Budget, Ledger
    out = []
    for source, count in store.sources():
        info = store.source_info(source) or {}
        budget = Budget(info.get("epsilon", 1.0), info.get("delta", 1e-5), info.get("accountant", "exact"))
        led = Ledger(store, source, budget, info.get("party_id"), note=False)
        entries = led.entries
        runs: dict = {}
        for e in entries:
            runs.setdefault(e.run, {"train": 0, "eval": 0})[e.kind] += 1
        spent = led.epsilon_of(entries)
        plans = [_plan_row(store, source, p, budget) for p in store.plans(source)]
        out.append({"plans": plans, "source": info.get("about") or source, "key": source,
                    "party_id": info.get("party_id"),
                    "budget_epsilon": info.get("epsilon"), "delta": budget.delta, "accountant": budget.accountant,
                    "releases": count, "runs": runs, "spent_epsilon": spent,
                    "remaining_epsilon": None if info.get("epsilon") is None else max(0.0, info["epsilon"] - spent)})
    return out


def _plan_row(store, source, plan, budget) -> dict:
    """What ``flower-vfl ledger`` shows of a plan: its runs, status, releases, ε, last activity."""
    from flower_vfl.privacy.accounting import epsilon_for_events
    made = [(e.mechanism, e.noise_multiplier) for e in store.entries(source) if e.run == plan.plan]
    planned = [(plan.mechanism, plan.noise_multiplier)] * (plan.train + plan.eval)

    def eps(events):
        return float(epsilon_for_events(events, budget.delta, budget.accountant)) if events else 0.0
    return {"plan": plan.plan, "runs": list(plan.runs), "status": plan.status, "made": plan.made,
            "planned": plan.train + plan.eval, "reserved": len(plan.reserved_events()),
            "planned_epsilon": eps(planned), "spent_epsilon": eps(made), "updated": plan.updated}


def _plan_expiry(args) -> float:
    """The node config's dp-plan-expiry (``--node-config``), else the default."""
    from flower_vfl.privacy.ledger import PLAN_EXPIRY
    if args.node_config:
        kv = _node_config(args)
        if "dp-plan-expiry" in kv:
            return float(kv["dp-plan-expiry"])
    return PLAN_EXPIRY


def _print_plans(d: dict, expiry: float, path):
    import time
    stamp = lambda t: time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))  # noqa: E731
    for p in d["plans"]:
        line = (f"    plan run {p['plan']} (runs {', '.join(p['runs'])}): {p['status']}; {p['made']} of {p['planned']} "
                f"release(s) made, {p['reserved']} reserved; ε={p['planned_epsilon']:.4g} planned, "
                f"ε={p['spent_epsilon']:.4g} spent; last activity {stamp(p['updated'])}")
        if p["status"] == "open" and p["reserved"]:
            line += (f", lapses {stamp(p['updated'] + expiry)} (dp-plan-expiry={expiry:g} s); release it now: "
                     f"flower-vfl ledger --state-dir {path} --release-plan {p['plan']}")
        print(line)


def _release(args, store, out, path) -> int:
    """``--release-plan RUN``: the operator gives up that open reservation on every source."""
    done = [d for d in out if any(p["plan"] == args.release_plan and p["status"] == "open" for p in d["plans"])
            and store.release_plan(d["key"], args.release_plan)]
    if not done:
        print(f"flower-vfl ledger: no open plan of run {args.release_plan!r} at {path}; `flower-vfl ledger "
              f"--state-dir {path}` lists the plans", file=sys.stderr)
        return 2
    for d in done:
        p = next(p for p in d["plans"] if p["plan"] == args.release_plan)
        print(f"flower-vfl ledger: released the reservation of plan run {p['plan']} on {_describe(d['source'])}: "
              f"its {p['made']} made release(s) (ε={p['spent_epsilon']:.4g}) stay charged, its "
              f"{p['reserved']} unmade one(s) are no longer reserved")
    return 0


def _describe(about) -> str:
    if isinstance(about, dict) and about.get("kind") == "files":
        return f"{about.get('data-path')} (IDs: {about.get('id-column') or about.get('id-path')})"
    if isinstance(about, dict) and about.get("kind") == "bundled":
        return f"bundled {about.get('dataset')} ({about.get('location')}), partition {about.get('partition-id')}"
    return str(about)


def _others(path: Path) -> dict:
    """The label ledger and the PSI log kept in the same state folder (empty lists when absent)."""
    from flower_vfl.io.psi_log import psi_log_rows
    from flower_vfl.privacy.label_dp import label_ledger_rows
    folder = path.parent if path.suffix == ".sqlite" else path
    return {"labels": label_ledger_rows(folder), "psi": psi_log_rows(folder)}


def _print_others(others: dict):
    for r in others["labels"]:
        print(f"  labels {r['source']}: one randomized response at ε_label={r['label_epsilon']:g} (flip "
              f"probability {r['flip_probability']:.4g}), {r['labels_drawn']} label(s) drawn, reused by "
              f"{r['runs']} run(s); spent ε={r['spent_epsilon']:.4g}")
    for r in others["psi"]:
        print(f"  PSI {r['source']} ({r['kind']}): {r['distinct_asked']} distinct ID(s) asked of a cap of "
              f"{r['cap']} (own set {r['own_size']}); {r['answers']} answer(s), {r['refused']} refused")


def cmd_ledger(args) -> int:
    from flower_vfl.privacy.store import PartyStore, count_journals, accept_reset, journal_check
    path = _state_dir(args)
    check = journal_check(path)
    others = _others(path)
    if args.accept_reset:
        folder = Path(check["ledger_file"]).parent
        if not (check["ledger_exists"] or check["journal_exists"] or count_journals(folder)):
            print(f"flower-vfl ledger: nothing to reset at {path} (no ledger, no journal)", file=sys.stderr)
            return 2
        done = accept_reset(path)
        if check["ledger_exists"] or check["journal_exists"]:
            print(f"flower-vfl ledger: reset accepted at {path}: the journal named {done['journaled']} release(s), "
                  f"the ledger holds {done['in_ledger']}; {done['missing']} are forgotten (their budget is spent "
                  f"again from now). The old journal is kept at {done['archived_journal']}")
        for old in done["archived_others"]:      # label-store / psi-log journals short of their file
            print(f"flower-vfl ledger: reset accepted for {old.rsplit('.journal', 1)[0]}.sqlite: what it lost is "
                  f"forgotten; the old journal is kept at {old}")
        return 0
    from flower_vfl.privacy.store import count_journal_losses
    losses = count_journal_losses(Path(check["ledger_file"]).parent)
    for lost in losses:
        print(f"flower-vfl ledger: {lost['file']} holds {lost['held']} row(s) but its journal {lost['journal']} "
              f"recorded {lost['recorded']}; the party refuses to use it. Restore the file, or accept the loss with "
              f"--accept-reset", file=sys.stderr)
    if not check["ledger_exists"]:
        if check["journal_exists"]:
            print(f"flower-vfl ledger: the ledger {check['ledger_file']} is MISSING, but its journal names "
                  f"{check['journaled']} charged release(s); the party refuses to start. Restore the file, or "
                  f"accept the loss with --accept-reset", file=sys.stderr)
            return 3
        if others["labels"] or others["psi"]:
            if args.json:
                print(json.dumps({"sources": [], **others}, indent=2))
            else:
                print(f"party state {path} (no private release was made there)")
                _print_others(others)
            return 3 if losses else 0
        if losses:
            return 3
        if not (args.state_dir or args.node_config):
            print(f"flower-vfl ledger: no party store at {path}, the per-user default of in-process runs and "
                  "flower-vfl simulate (no private release was ever made there); a SuperNode's ledger is in its "
                  "node config's state-dir: give --state-dir or --node-config", file=sys.stderr)
            return 2
        print(f"flower-vfl ledger: no party store at {path} (no private release was ever made there); "
              "give the party's --state-dir", file=sys.stderr)
        return 2
    store = PartyStore(path, check=False)
    out = ledger_summary(store)
    if args.release_plan:
        return _release(args, store, out, path)
    if args.json:
        print(json.dumps({"sources": out, **others, "journal": check}, indent=2))
        return 3 if check["missing"] or losses else 0
    print(f"party store {store.path}")
    if check["missing"]:
        print(f"  LEDGER SHORTER THAN ITS JOURNAL: {check['missing']} of the {check['journaled']} journaled "
              "release(s) are gone (file replaced or WAL lost); the party refuses to start until "
              "--accept-reset")
    for d in out:
        left = "?" if d["remaining_epsilon"] is None else f"{d['remaining_epsilon']:.4g}"
        print(f"  {_describe(d['source'])}, party {d['party_id']}: budget ε={d['budget_epsilon']} "
              f"δ={d['delta']:g} ({d['accountant']}); {d['releases']} releases over {len(d['runs'])} run(s); "
              f"spent ε={d['spent_epsilon']:.4g}, left ε={left}")
        for run, kinds in d["runs"].items():
            print(f"    run {run}: {kinds['train']} training, {kinds['eval']} model release(s)")
        _print_plans(d, _plan_expiry(args), path)
    _print_others(others)
    return 3 if check["missing"] or losses else 0
