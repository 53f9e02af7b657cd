"""``flower-vfl ledger``: a party's privacy spend on each data source, from its own state-dir.

    flower-vfl ledger --node-config "partition-id=1 state-dir=/srv/party1"
    flower-vfl ledger --state-dir /srv/party1 --json

For every source the party's node config ever declared (its files and ID column, or a
bundled dataset and partition: :mod:`flower_vfl.clients.source`): the budget last
configured, the releases per run, the ε spent (the party's accountant over the noise
multipliers it charged, every run and view composed) and what is left.
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
                                                   "or ~/.flower-vfl/party-state)")
    p.add_argument("--node-config", default="", help="or the SuperNode's --node-config string (reads state-dir)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_ledger)
    return p


def _state_dir(args) -> Path:
    from flower_vfl.privacy.store import default_state_dir
    state = args.state_dir
    if args.node_config:
        kv = dict(item.split("=", 1) for item in shlex.split(args.node_config) if "=" in item)
        state = state or kv.get("state-dir", "")
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
        out.append({"source": info.get("about") or source, "key": source, "party_id": info.get("party_id"),
                    "budget_epsilon": info.get("epsilon"), "delta": budget.delta, "accountant": budget.accountant,
                    "releases": count, "runs": runs, "spent_epsilon": spent,
                    "remaining_epsilon": None if info.get("epsilon") is None else max(0.0, info["epsilon"] - spent)})
    return out


def _describe(about) -> str:
    if isinstance(about, dict) and about.get("kind") == "files":
        return f"{about.get('data-path')} (IDs: {about.get('id-column') or about.get('id-path')})"
    if isinstance(about, dict) and about.get("kind") == "bundled":
        return f"bundled {about.get('dataset')} ({about.get('location')}), partition {about.get('partition-id')}"
    return str(about)


def cmd_ledger(args) -> int:
    from flower_vfl.privacy.store import PartyStore
    path = _state_dir(args)
    if not (path / "party.sqlite").is_file() and not path.is_file():
        print(f"flower-vfl ledger: no party store at {path} (no private release was ever made there); "
              "give the party's --state-dir", file=sys.stderr)
        return 2
    store = PartyStore(path)
    out = ledger_summary(store)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"party store {store.path}")
    for d in out:
        left = "?" if d["remaining_epsilon"] is None else f"{d['remaining_epsilon']:.4g}"
        print(f"  {_describe(d['source'])}, party {d['party_id']}: budget ε={d['budget_epsilon']} "
              f"δ={d['delta']:g} ({d['accountant']}); {d['releases']} releases over {len(d['runs'])} run(s); "
              f"spent ε={d['spent_epsilon']:.4g}, left ε={left}")
        for run, kinds in d["runs"].items():
            print(f"    run {run}: {kinds['train']} training, {kinds['eval']} model release(s)")
    return 0
