"""The central node's checkpoint: what a resumed run needs, and what makes it the same run.

One atomic file per state folder (:mod:`flower_vfl.io.checkpoint`), rewritten after every
round. It holds three things:

- **the state** of the label owner after round k: z, y, q, the intercept, rho, the last
  release s_m of every party, the z-update's predictor, the accelerator's history, the
  history rows and the private parties' privacy reports (bitwise: a resumed run continues
  with the same iterates);
- **the run record** (:func:`run_record`): every setting that defines the run (the strategy's
  arguments and the parties' run-config settings such as ``lam``, with the run config's key
  names) and what the parties said of their data at identify (:func:`party_record`). A resume
  whose record differs is refused naming each difference (:func:`check_same_run`), before any
  party is contacted for the settings and right after identify for the parties;
- **the replay record** of every non-private party: the inputs of the last round it answered,
  in the form a party without state needs (``q - s_prev / theta``, y, rho). A party that
  comes back without its state (a new run, a restarted SuperNode) is sent that round again
  before anything else, so that it holds the same x_m as before the interruption; its new
  release must equal the checkpointed one, or the resume is refused (its data or settings
  changed). See :meth:`flower_vfl.strategies.vertical_rounds.FlowerRounds.resync`.

It also keeps each private party's **plan token** (its identify reply): a resume sends it back
at identify, and the party continues that plan (its releases, its iterate, no second charge)
instead of admitting a new one. Under secure aggregation, where the central node holds no replay
record (it never sees a party's release), a non-private party's identify reply carries a **resume
token** instead, kept the same way: a resume sends it back with the checkpoint's round
(``resume-round``) and the party restores its own state of that round from its state-dir
(:func:`flower_vfl.clients.party_secagg.resume_identify`). The first checkpoint (round 0) is written
right after identify, so a crash at any later point can be resumed.
"""

from __future__ import annotations

import numpy as np

from flower_vfl.errors import UserError
from flower_vfl.io.checkpoint import load_checkpoint, save_checkpoint
from flower_vfl.reporting.report import to_jsonable

__all__ = ["ResumeRefused", "plans", "run_record", "party_record", "check_same_run", "check_same_parties", "save",
           "load", "restore", "replay_q"]


class ResumeRefused(UserError, ValueError):
    """A resume that would not continue the checkpoint's run (other settings or other data)."""


def run_record(st, state) -> dict:
    """The settings that define the run (run-config key names where the run config has one):
    ``st`` the strategy (its settings), ``state`` the run (:class:`~.vertical_admm.VADMMState`)."""
    c = state.central
    rec = {"num-parties": st.num_parties, "loss": st.loss_name, "n": int(c.n), "rho": st.rho_requested,
           "alpha": float(c.alpha), "variant": st.variant, "fit-intercept": bool(c.fit_intercept),
           "max-rounds": int(st.rounds_of(state)), "tol": float(st.tol), "tol_abs": float(st.tol_abs),
           "adaptive_rho": bool(st.adaptive_rho), "acceleration": str(st.acceleration),
           "penalty": str(st.penalty), "constraint": None if st.constraint is None else repr(st.constraint),
           "label-epsilon": float(st.label_epsilon or 0.0), "stragglers": st.stragglers}
    if getattr(st, "wire_dtype", "float64") != "float64":    # float32 on the wire rounds the iterates
        rec["wire-dtype"] = st.wire_dtype
    rec.update({k: v for k, v in (st.run_settings or {}).items()})
    return to_jsonable(rec)


def party_record(state) -> dict:
    """What the parties declared at identify: private plan and data description per party."""
    return to_jsonable({"private_parties": {str(m): t for m, t in sorted(state.private_parties.items())},
                        "data": {str(m): v for m, v in sorted(state.party_data.items())}})


def _differences(theirs: dict, mine: dict) -> list[str]:
    out = []
    for key in sorted(set(theirs) | set(mine)):
        a, b = theirs.get(key, "(not recorded)"), mine.get(key, "(not recorded)")
        if a != b:
            out.append(f"{key}={a!r} in the checkpoint, {b!r} in this run")
    return out


def _refuse(folder, what: str, diffs: list[str], fix: str):
    raise ResumeRefused(f"resume={str(folder)!r}: the checkpoint was made by another {what}: " + "; ".join(diffs)
                        + f". {fix}")


def check_same_run(folder, header: dict, mine: dict) -> None:
    """Refuse a resume whose settings differ from the checkpoint's, naming every difference."""
    if "run" not in header:
        raise ResumeRefused(f"resume={str(folder)!r}: the checkpoint records no run settings (it was written by an "
                            "earlier version), so a resume cannot be checked to continue the same run; start a new "
                            "run without resume")
    diffs = _differences(header["run"], mine)
    if diffs:
        _refuse(folder, "run", diffs, "Resume with the checkpoint's settings, or start a new run without resume")


def check_same_parties(folder, header: dict, mine: dict) -> None:
    """Refuse a resume whose parties declare another plan or other data than at the checkpoint."""
    theirs = header.get("parties", {})
    diffs = []
    for part, name in (("private_parties", "private parties (party: dp-train-rounds)"), ("data", "party data")):
        a, b = theirs.get(part, {}), mine.get(part, {})
        if a != b:
            diffs.append(f"{name} {a!r} in the checkpoint, {b!r} now")
    if diffs:
        _refuse(folder, "set of parties", diffs, "Resume with the parties' original data and node configs, or start "
                "a new run without resume")


def replay_q(q, s_prev, theta):
    """The q that makes a party without state (s_m = 0) take the x-update of a party that
    released ``s_prev``: its target z_loc = s_m - theta q is the same (eq. 6, alpha = 1)."""
    return q if s_prev is None else q - s_prev / theta


def plans(ckpt) -> dict:
    """party (str) -> plan token of a loaded checkpoint ``(arrays, header)`` ({} for None)."""
    if ckpt is None:
        return {}
    got = ckpt[1].get("plans") or {}
    return {str(m): str(t) for m, t in got.items()} if isinstance(got, dict) else {}


def save(st, state, k, i_phase, j, stopped) -> None:
    """Checkpoint after round ``k`` (phase ``i_phase``, its round ``j``; ``stopped``: the
    stopping rule ended the phase) of the run ``state`` of strategy ``st``: handed to
    ``state.writer`` as a snapshot; durable once ``state.writer.wait()`` returned."""
    if not st.state_dir:
        return
    c = state.central
    arrays = {"z": c.z, "y": c.y, "q": c.q, "b": np.asarray(c.b), **c.predictor_state()}
    if st.label_privacy_ is not None:   # the one label-DP draw: a resumed run reuses it
        arrays["t_label_dp"] = state.t
    arrays.update({f"s{m}": np.asarray(v) for m, v in state.last_s.items()})
    replay, ys = {}, {}
    for m, (rk, q, y, rho, s_prev) in sorted(state.replay.items()):
        arrays[f"rq{m}"] = replay_q(q, s_prev, c.theta)
        key = ys.setdefault(id(y), f"ry{m}")     # one copy of a y several parties were sent
        arrays.setdefault(key, y)
        replay[str(m)] = {"round": int(rk), "rho": float(rho), "y": key}
    aa = None
    acc = state.driver.acc
    if acc is not None:
        aa_arrays, aa = acc.get_state()
        arrays.update(aa_arrays)
        arrays.update({f"aq{m}": q for m, q in enumerate(state.driver.qs or [])})
    header = {"round": k, "phase": i_phase, "j": j, "phase_stopped": bool(stopped), "rho": c.rho,
              "theta": c.theta, "run": state.run_record, "parties": party_record(state), "replay": replay,
              "node_to_party": {str(n): p for n, p in state.exchange.node_to_party.items()},
              "stale": {str(m): v for m, v in state.stale.items()},
              "history": state.history, "privacy": state.privacy, "anderson": aa,
              "plans": {str(m): t for m, t in sorted(state.party_plans.items())}}
    # a snapshot (the next round updates z, y, q and Anderson's history in place), written by
    # the strategy's RoundWriter while the parties compute the next round (io/writer.py)
    arrays = {key: np.array(v, copy=True) for key, v in arrays.items()}
    header, folder = to_jsonable(header), st.state_dir
    state.writer.submit(lambda: save_checkpoint(folder, arrays, header))


def load(folder, mine: dict) -> tuple[dict, dict]:
    """``(arrays, header)`` of the checkpoint in ``folder``, its run record checked against ``mine``."""
    arrays, header = load_checkpoint(folder)
    check_same_run(folder, header, mine)
    return arrays, header


def restore(st, state, folder, arrays: dict, h: dict) -> tuple:
    """Put a loaded checkpoint's state into the run ``state`` of strategy ``st`` (its parties checked
    first); returns the driver's start (round, phase, j, phase_stopped)."""
    check_same_parties(folder, h, party_record(state))
    c = state.central
    c.z, c.y, c.q = arrays["z"], arrays["y"], arrays["q"]
    if "t_label_dp" in arrays:     # the checkpointed privatized labels, not a second draw
        state.t = c.t = arrays["t_label_dp"]
    c.b = np.float64(arrays["b"][()]) if arrays["b"].ndim == 0 else arrays["b"]
    c.set_rho(h["rho"])
    c.set_predictor_state(arrays)      # the z-update's warm-start predictor (core/central.py)
    state.last_s.update({int(k[1:]): v for k, v in arrays.items() if k[0] == "s" and k[1:].isdigit()})
    # the replay record, already in the form a party without state needs (s_prev folded in)
    state.replay = {int(m): (r["round"], arrays[f"rq{m}"], arrays[r["y"]], r["rho"], None)
                  for m, r in h["replay"].items()}
    acc = state.driver.acc
    if acc is not None and h.get("anderson") is not None:
        acc.set_state(arrays, h["anderson"])
        qs = [arrays.get(f"aq{m}") for m in range(st.num_parties)]
        state.driver.qs = None if any(q is None for q in qs) else qs
    state.stale = {int(m): v for m, v in h["stale"].items()}
    state.history[:] = h["history"]          # the driver's list: it appends the next rounds
    state.privacy = {int(m): v for m, v in h["privacy"].items()}
    return h["round"], h["phase"], h["j"], h["phase_stopped"]
