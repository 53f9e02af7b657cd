"""What a 1-in-5 dropout costs in rounds, with ``stragglers='stale'`` (bounded staleness).

a9a, 2 parties (the paper split), logistic, L2 lam=1e-4, through the real strategy and party
handlers in process (LocalGrid). Each round, each party's train message is lost with
probability 1/5 (the party never sees it; the round goes on with its last release). A lost
party more than ``max-staleness`` rounds in a row would be waited for; with 1/5 and
max-staleness=5 that did not happen in these runs (counted below).

Measured: rounds until the objective is within ``gap`` of the best objective of a long clean
run, for the clean run and for dropout runs with several seeds.

    python benchmarks/bench_dropout.py [--rounds 200] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from flower_vfl.apps import client as ca
from flower_vfl.apps import server as sa
from flower_vfl.deploy.local_grid import LocalGrid

HANDLERS = {"train": ca.train, "evaluate": ca.evaluate, "query.identify": ca.identify}


class DropGrid(LocalGrid):
    """Loses each train message with probability ``p`` (seeded)."""

    def __init__(self, rc, p, seed, rounds=()):
        super().__init__(HANDLERS, {100: {"partition-id": 0}, 101: {"partition-id": 1}}, rc)
        self.p, self.rng, self.lost, self.rounds = p, np.random.default_rng(seed), 0, set(rounds)

    def send_and_receive(self, messages, *, timeout=None):
        keep = []
        for msg in messages:
            train = msg.metadata.message_type == "train"
            single = train and msg.metadata.dst_node_id == 101 and int(msg.content["config"]["round"]) in self.rounds
            if single or (train and self.rng.random() < self.p):
                msg.metadata.__dict__["_message_id"] = msg.object_id
                self.lost += 1
                continue
            keep.append(msg)
        return super().send_and_receive(keep, timeout=timeout)


def objectives(rc, p, seed, rounds=()):
    grid = DropGrid(rc, p, seed, rounds)
    st = sa.make_strategy(rc)
    st.start(grid)
    return np.array([r.get("objective", np.nan) for r in st.history_]), grid.lost, sum(r.get("stale", 0) for r in st.history_)


def rounds_to(obj, target):
    hit = np.nonzero(obj <= target)[0]
    return int(hit[0]) + 1 if hit.size else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--p", type=float, default=0.2)
    args = ap.parse_args(argv)
    rc = {"dataset": "a9a", "num-parties": 2, "max-rounds": args.rounds, "party-wait": 0.0,
          "stragglers": "stale", "max-staleness": 5}
    clean, _, _ = objectives(rc, 0.0, 0)
    best = float(np.nanmin(clean))
    gaps = (1e-2, 1e-3, 1e-4)
    rows = {"clean": {"rounds_to_gap": {str(g): rounds_to(clean, best * (1 + g)) for g in gaps}}}
    obj, lost, stale = objectives(rc, 0.0, 0, rounds=(5,))
    rows["one miss (party 1, round 5)"] = {"rounds_to_gap": {str(g): rounds_to(obj, best * (1 + g)) for g in gaps},
                                           "lost_messages": lost, "stale_party_rounds": stale}
    for seed in range(args.seeds):
        obj, lost, stale = objectives(rc, args.p, seed + 1)
        rows[f"dropout seed {seed + 1}"] = {"rounds_to_gap": {str(g): rounds_to(obj, best * (1 + g)) for g in gaps},
                                            "lost_messages": lost, "stale_party_rounds": stale}
    print(f"a9a, 2 parties, {args.rounds} rounds, best clean objective {best:.8f}")
    print("run".ljust(28) + "".join(f"rounds to gap {g:g}".rjust(22) for g in gaps) + "  lost msgs")
    for name, r in rows.items():
        print(name.ljust(28) + "".join(str(r["rounds_to_gap"][str(g)]).rjust(22) for g in gaps)
              + f"  {r.get('lost_messages', 0)}")
    out = Path(__file__).parent / "results" / "bench_dropout.json"
    out.write_text(json.dumps({"config": rc, "p": args.p, "best_objective": best, "runs": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
