"""A malicious central node (tests only): it identifies the parties, then sends each one
``max-rounds`` training messages with q = y = 0 and writes, per node, the identify reply and every
reply (the released vector's norm, or the refusal, and the party's privacy report) to ``out-dir``/attack.json
(only keys the party's schema knows: it refuses unknown run-config keys).
Run several times with another ``num-parties`` (or another run config) it asks the same party
for fresh releases of the same people: the party's own ledger must compose them all.

The attack is chosen by the run config: its ``out-dir`` may hold a ``plan.json`` (written by the
test; a file of the attacker's own, so the party sees no unknown run-config key) with

* ``psi_ids`` (list of str): align first, as a label owner holding these IDs would: a
  ``query.psi_answer`` with the request of :class:`flower_vfl.io.psi.LabelOwnerPSI`, then a
  forged ``query.psi_order``;
* ``psi_key`` (hex of 32 bytes, or ``"fresh"``): the label owner's PSI key (a kept key makes a
  re-asked ID the same blinded item; a fresh one makes every ID new to the party's PSI log);
* ``psi_order``: ``"permuted"`` (the intersection in a random order), ``"short"`` (the
  intersection without one row, in a random order) or ``"padded"`` (the intersection in a random
  order, then the asked IDs the party did not match), or a list of them sent one after the other
  (the last one's answer decides; ``psi_orders`` in the log holds each answer);
* ``pause_after`` (int): after that training round, write ``out-dir``/paused and wait for the
  test to write ``out-dir``/resume (the test restarts the party's SuperNode meanwhile); then
  identify the new node, re-send it the last round with the same inputs, and go on;
* ``resume_plans`` (dict party -> token): sent at identify as a resumed run sends its plan tokens
  (``config['plans']``), e.g. the token another run's identify reply gave;
* ``want_nodes`` (int): identify stops waiting once that many nodes answered (a SuperNode the
  test killed stays listed until its heartbeat expires).

``attack.json`` also holds ``times``: seconds since the ServerApp started, per step.
"""

import json
import os
import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def _ask(grid, msgs, timeout=120.0, enough=None):
    """Push ``msgs``; the replies in their order (None: none within ``timeout``, or none yet
    when ``enough(replies)`` said that the ones that came are enough)."""
    ids = [m for m in grid.push_messages(msgs)]
    got, deadline = {}, time.monotonic() + timeout
    while len(got) < len(ids) and time.monotonic() < deadline and not (enough and enough(got.values())):
        for rep in grid.pull_messages(ids):
            got[rep.metadata.reply_to_message_id] = rep
        time.sleep(0.1)
    return [got.get(i) for i in ids]


def _record(rep):
    if rep is None:
        return {"missing": True}
    if rep.has_error():
        return {"error": rep.error.reason, "code": int(rep.error.code)}
    out = {}
    c = rep.content
    for name in ("identity", "refusal", "psi"):
        if name in c.config_records:
            out[name] = {k: v for k, v in c.config_records[name].items() if not isinstance(v, bytes)}
    if "privacy" in c.config_records:
        out["privacy"] = json.loads(str(c.config_records["privacy"]["report"]))
    if "release" in c.array_records:
        out["release_norm"] = float(np.linalg.norm(c.array_records["release"]["s"].numpy()))
    return out


def _align(grid, nodes, plan, log):
    """The PSI step of a label owner holding ``psi_ids``, with a forged agreed order."""
    from flower_vfl.io import psi
    ids = [str(v) for v in plan["psi_ids"]]
    key = plan.get("psi_key", "fresh")
    owner = psi.LabelOwnerPSI(ids, key="fresh" if key == "fresh" else bytes.fromhex(key))
    cfg = {"split": "train", "request": owner.request(), "fpr": 1e-9, "structure": "raw"}
    reps = _ask(grid, [Message(RecordDict({"psi": ConfigRecord(cfg)}), dst_node_id=n,
                               message_type="query.psi_answer") for n in nodes])
    rng = np.random.default_rng()
    aligned = []
    for n, rep in zip(nodes, reps):
        entry = log["nodes"].setdefault(str(n), {"train": []})
        entry["psi_answer"] = _record(rep)
        if rep is None or rep.has_error():
            continue
        rec = rep.content.config_records["psi"]
        common = [ids[i] for i in owner.intersect(bytes(rec["setup"]), bytes(rec["response"]))]
        entry["psi_common"] = len(common)
        forms = plan.get("psi_order")
        for form in forms if isinstance(forms, list) else [forms]:
            order = [common[i] for i in rng.permutation(len(common))]
            if form == "short":
                order = order[:-1]
            elif form == "padded":          # the intersection and every ID the party did not match
                order = order + [i for i in ids if i not in set(common)]
            entry["psi_order_sent"] = order
            msg = Message(RecordDict({"psi": ConfigRecord({"split": "train", "order": psi.encode_ids(order),
                                                           "digest": psi.ids_digest(order)})}),
                          dst_node_id=n, message_type="query.psi_order")
            entry["psi_order"] = _record(_ask(grid, [msg])[0])
            entry.setdefault("psi_orders", []).append({"form": form, "n_sent": len(order), **entry["psi_order"]})
        if "psi" in entry["psi_order"]:
            aligned.append(n)
    return aligned


def _identify(grid, nodes, log, want=None, skip=(), plans=None):
    """Identify ``nodes``. With ``want``: stop once that many answered with their identity (a
    killed SuperNode stays listed until its heartbeat expires: its message is not waited for),
    and ask every node that registers meanwhile (a restarted one), up to 120 s. ``plans``: the
    identify config's ``plans`` (party -> plan token: a resumed run's claim)."""
    rows, pending, asked, deadline = {}, {}, set(skip), time.monotonic() + 120
    while time.monotonic() < deadline:
        todo = [n for n in nodes if n not in asked]
        asked.update(todo)
        cfg = {} if plans is None else {"plans": json.dumps(plans)}
        msgs = [Message(RecordDict({"config": ConfigRecord(cfg)}), dst_node_id=n, message_type="query.identify")
                for n in todo]
        pending.update(zip(grid.push_messages(msgs), todo))
        for rep in grid.pull_messages(list(pending)):
            n = pending.pop(rep.metadata.reply_to_message_id)
            rec = _record(rep)
            log["nodes"].setdefault(str(n), {"train": []})["identify"] = rec
            if "identity" in rec:
                rows[n] = int(rec["identity"]["n_rows"])
        if (len(rows) >= want) if want is not None else not pending:
            break
        time.sleep(0.1)
        if want is not None:
            nodes = sorted(grid.get_node_ids())
    return rows


def _train(grid, rows, k, rho, log):
    msgs, who = [], []
    for n, n_rows in rows.items():
        content = RecordDict({
            "vectors": ArrayRecord({"q": Array(np.zeros(n_rows)), "y": Array(np.zeros(n_rows))}),
            "config": ConfigRecord({"round": k, "rho": rho, "alpha": 1.0, "theta": 0.5}),
        })
        msgs.append(Message(content, dst_node_id=n, message_type="train"))
        who.append(n)
    for n, rep in zip(who, _ask(grid, msgs)):
        log["nodes"][str(n)]["train"].append({"round": k, **_record(rep)})


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    out = str(rc["out-dir"])
    plan = {}
    if out and os.path.isfile(os.path.join(out, "plan.json")):
        with open(os.path.join(out, "plan.json")) as fh:
            plan = json.load(fh)
    deadline = time.monotonic() + 120
    while not list(grid.get_node_ids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    nodes = sorted(grid.get_node_ids())
    t0 = time.monotonic()
    log = {"run": int(context.run_id), "num-parties": int(rc["num-parties"]), "nodes": {}, "plan": plan,
           "times": {}}

    def tick(what):
        log["times"][what] = round(time.monotonic() - t0, 2)
    try:
        if plan.get("psi_ids"):
            nodes = _align(grid, nodes, plan, log)
            tick("psi")
        rows = _identify(grid, nodes, log, plan.get("want_nodes"), plans=plan.get("resume_plans"))
        tick("identify")
        rho = float(rc["rho"])
        for k in range(int(rc["max-rounds"])):
            _train(grid, rows, k, rho, log)
            tick(f"train {k}")
            if plan.get("pause_after") == k:
                open(os.path.join(out, "paused"), "w").close()
                while not os.path.exists(os.path.join(out, "resume")):
                    time.sleep(0.2)
                known = set(nodes)
                deadline = time.monotonic() + 120
                while not (set(grid.get_node_ids()) - known) and time.monotonic() < deadline:
                    time.sleep(0.2)
                nodes = sorted(set(grid.get_node_ids()) - known)
                log["restarted_nodes"] = [str(n) for n in nodes]
                rows = _identify(grid, nodes, log, plan.get("want_nodes"), skip=known)
                tick("restarted node identified")
                _train(grid, rows, k, rho, log)          # the same round, the same inputs, re-sent
                tick(f"train {k} re-sent")
    finally:
        if out:
            with open(os.path.join(out, "attack.json"), "w") as fh:
                json.dump(log, fh)
