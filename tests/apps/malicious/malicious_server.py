"""A malicious central node (tests only): it identifies the parties, then sends each one
``max-rounds`` training messages with q = y = 0 and writes, per node, the identify reply and every
reply (the released vector's norm, or the refusal, and the party's privacy report) to ``out-dir``/attack.json
(only keys the party's schema knows: it refuses unknown run-config keys).
Run several times with another ``num-parties`` (or another run config) it asks the same party
for fresh releases of the same people: the party's own ledger must compose them all."""

import json
import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def _ask(grid, msgs, timeout=300.0):
    ids = [m for m in grid.push_messages(msgs)]
    got, deadline = {}, time.monotonic() + timeout
    while len(got) < len(ids) and time.monotonic() < deadline:
        for rep in grid.pull_messages(ids):
            got[rep.metadata.reply_to_message_id] = rep
        time.sleep(0.2)
    return [got.get(i) for i in ids]


def _record(rep):
    if rep is None:
        return {"missing": True}
    if rep.has_error():
        return {"error": rep.error.reason}
    out = {}
    c = rep.content
    if "identity" in c.config_records:
        out["identity"] = dict(c.config_records["identity"])
    if "refusal" in c.config_records:
        out["refusal"] = dict(c.config_records["refusal"])
    if "privacy" in c.config_records:
        out["privacy"] = json.loads(str(c.config_records["privacy"]["report"]))
    if "release" in c.array_records:
        out["release_norm"] = float(np.linalg.norm(c.array_records["release"]["s"].numpy()))
    return out


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    deadline = time.monotonic() + 120
    while not list(grid.get_node_ids()) and time.monotonic() < deadline:
        time.sleep(0.5)
    nodes = sorted(grid.get_node_ids())
    idents = _ask(grid, [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n,
                                 message_type="query.identify") for n in nodes])
    log = {"run": int(context.run_id), "num-parties": int(rc["num-parties"]), "nodes": {}}
    for n, rep in zip(nodes, idents):
        log["nodes"][str(n)] = {"identify": _record(rep), "train": []}
    for k in range(int(rc["max-rounds"])):
        msgs, who = [], []
        for n, rep in zip(nodes, idents):
            info = _record(rep).get("identity")
            if not info:
                continue
            rows = int(info["n_rows"])
            content = RecordDict({
                "vectors": ArrayRecord({"q": Array(np.zeros(rows)), "y": Array(np.zeros(rows))}),
                "config": ConfigRecord({"round": k, "rho": float(rc["rho"]), "alpha": 1.0,
                                        "theta": 0.5}),
            })
            msgs.append(Message(content, dst_node_id=n, message_type="train"))
            who.append(n)
        for n, rep in zip(who, _ask(grid, msgs)):
            log["nodes"][str(n)]["train"].append(_record(rep))
    if str(rc["out-dir"]):
        with open(str(rc["out-dir"]) + "/attack.json", "w") as fh:
            json.dump(log, fh)
