"""Issue 23 item 1 on the party side: every value a party receives is range-checked against its
own limits, settings it cannot honour are refused before any round, the PLD accountant's work
is bounded, and a state folder that cannot be written is named (nothing committed is lost).
Through the real ClientApp handlers with a fresh Flower Context per run."""

import os
import shutil
import subprocess
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.clients import party_private, psi_party
from flower_vfl.config.schema import ConfigError
from flower_vfl.privacy import accounting
from flower_vfl.privacy.boundary import InvalidMessage
from flower_vfl.privacy.store import PartyStore, StoreDiskError, journal_check

from _party_handlers import DELTA, N, RC, _task_identity  # noqa: F401  (_task_identity: autouse)


def node(state, **kw):
    return {"partition-id": 1, "dp": True, "dp-epsilon": 1.0, "dp-train-rounds": 4, "dp-eval-rounds": 1,
            "state-dir": str(state), **kw}


def ctx(nc, run_id=1, **rc):
    return Context(run_id=run_id, node_id=7, node_config=dict(nc), state=RecordDict(), run_config={**RC, **rc})


def send(handler, context, cfg, vectors=True, kind="train"):
    rd = RecordDict({"config": ConfigRecord({"round": 1, "rho": 1e-3, "alpha": 1.0, "theta": 0.5, **cfg})})
    if vectors:
        rng = np.random.default_rng(int(cfg.get("round", 1)))
        rd["vectors"] = ArrayRecord({"q": Array(rng.normal(size=N) * 0.1), "y": Array(rng.normal(size=N) * 1e-4)})
    return handler(Message(rd, dst_node_id=7, message_type=kind), context)


def close_stores():
    for store in party_private.OPEN_STORES.values():
        store.close()
    party_private.OPEN_STORES.clear()


# --------------------------------------------------------------- settings a private party cannot honour
@pytest.mark.parametrize("handler", [ca.identify, ca.train, ca.evaluate])
def test_a_private_party_refuses_penalty_l1_before_any_round(tmp_path, handler):
    with pytest.raises(ConfigError) as exc:
        send(handler, ctx(node(tmp_path), penalty="l1"), {})
    assert str(exc.value) == (
        "party 1 is private and its x-update is L2-regularized (its sensitivity bound needs the L2 term's "
        "strong convexity, docs/privacy.md); the run config's penalty='l1' is refused. Use penalty=l2, or run "
        "this party without dp")
    assert not (tmp_path / "party.sqlite").exists()            # nothing opened, nothing charged
    send(ca.train, ctx({"partition-id": 1}, penalty="l1"), {})  # a non-private party honours l1


@pytest.mark.parametrize("handler", [ca.identify, ca.evaluate])
def test_a_private_party_refuses_a_multinomial_run_at_identify(tmp_path, handler):
    with pytest.raises(ConfigError) as exc:
        send(handler, ctx(node(tmp_path), loss="multinomial"), {})
    assert str(exc.value) == (
        "party 1 is private and releases one noisy score vector per round; the run config's loss='multinomial' "
        "needs K score columns from every party, which its privacy calibration does not cover. Refused: use a "
        "binary loss (logistic) with this party private, or run it without dp")
    assert not (tmp_path / "party.sqlite").exists()


# --------------------------------------------------------------- a private party's rho without min-rho / max-rho
def _charged(state) -> int:
    close_stores()
    return PartyStore(state).count() if (state / "party.sqlite").exists() else 0


@pytest.mark.parametrize("rho", [1e150, 5e-324, 1e3 / N * 1.0001, 1e-3 / N * 0.9999])
@pytest.mark.parametrize("handler, kind", [(ca.train, "train"), (ca.evaluate, "evaluate")])
def test_a_private_party_without_rho_bounds_refuses_a_rho_far_from_its_scale(tmp_path, rho, handler, kind):
    """No min-rho / max-rho in its node config: the party's default range 1e-3/N .. 1e3/N from its
    own N (426 rows) refuses rho = 1e150 (a release of no use, charged) and rho = 5e-324 (before:
    a ZeroDivisionError in the calibration), before anything is charged; a fresh Context each."""
    state = tmp_path / "state"
    rep = dict(send(handler, ctx(node(state)), {"rho": rho, "final_update": kind == "evaluate"},
                    kind=kind).content["refusal"])
    assert rep == {"party": 1, "code": "invalid", "field": "config.rho", "reason": (
        f"party 1: config['rho']={rho!r} is outside the range this party accepts [{1e-3 / N:g}, {1e3 / N:g}] (its "
        "node config's min-rho / max-rho where set, else a private party's default 0.001/N .. 1000/N for its "
        f"N={N} rows: a rho far from the loss's scale 1/N buys no accuracy for the budget it spends; set min-rho "
        "/ max-rho in its node config to accept another); refused, nothing charged")}
    assert _charged(state) == 0


def test_the_default_range_is_inclusive_and_a_node_config_bound_replaces_one_end(tmp_path):
    state = tmp_path / "state"
    assert "release" in send(ca.train, ctx(node(state)), {"rho": 1e3 / N}).content         # inclusive
    assert _charged(state) == 1
    nc = node(tmp_path / "s2", **{"max-rho": 10.0})          # its own max; the default min stays
    assert "release" in send(ca.train, ctx(nc), {"rho": 5.0}).content
    rep = dict(send(ca.train, ctx(node(tmp_path / "s3", **{"max-rho": 10.0})), {"rho": 1e-9}).content["refusal"])
    assert rep["reason"].startswith(f"party 1: config['rho']=1e-09 is outside the range this party accepts "
                                    f"[{1e-3 / N:g}, 10] (its node config's min-rho / max-rho where set, else")
    # a node config that sets both bounds is the party's own choice, and named as such
    rep = dict(send(ca.train, ctx(node(tmp_path / "s4", **{"min-rho": 0.0, "max-rho": 10.0})),
                    {"rho": 20.0}).content["refusal"])
    assert rep["reason"] == ("party 1: config['rho']=20.0 is outside the range this party accepts [0, 10] (its node "
                             "config's min-rho / max-rho); refused, nothing charged")


def test_a_subnormal_rho_the_node_config_allows_is_refused_not_a_zero_division(tmp_path):
    """min-rho=0 (the party's own choice) lets 5e-324 through the range check; the calibration
    then refuses it (lam * rho underflows to 0: no finite sensitivity), nothing charged."""
    state = tmp_path / "state"
    nc = node(state, **{"min-rho": 0.0, "max-rho": 1.0, "dp-lam": 1e-2})    # lam * 1e-323 rounds to 0
    rep = dict(send(ca.train, ctx(nc), {"rho": 5e-324}).content["refusal"])
    assert rep == {"party": 1, "code": "invalid", "field": "config.rho", "reason": (
        "party 1: the train release at rho=5e-324 would have a non-finite sensitivity; refused, nothing charged "
        "(the party's node config can narrow the accepted rho with min-rho / max-rho)")}
    assert _charged(state) == 0


def test_a_non_private_party_keeps_the_protocol_range(tmp_path):
    nc = {"partition-id": 1, "state-dir": str(tmp_path)}
    assert "release" in send(ca.train, ctx(nc), {"rho": 1e6}).content


# --------------------------------------------------------------- evaluate's config values
@pytest.mark.parametrize("private", [True, False])
@pytest.mark.parametrize("cfg, text", [
    ({"n_outputs": 10**9}, "config['n_outputs']=1000000000 must be an integer in 1..{hi}"),
    ({"n_outputs": -3}, "config['n_outputs']=-3 must be an integer in 1..{hi}"),
    ({"n_outputs": 2.5}, "config['n_outputs']=2.5 must be an integer in 1..{hi}"),
    ({"final_update": "false"}, "config['final_update']='false' is not a boolean; send true or false"),
    ({"final_update": 1}, "config['final_update']=1 is not a boolean; send true or false"),
])
def test_evaluate_config_values_are_range_checked(tmp_path, private, cfg, text):
    nc = node(tmp_path) if private else {"partition-id": 1, "state-dir": str(tmp_path)}
    rep = dict(send(ca.evaluate, ctx(nc), cfg, vectors=False, kind="evaluate").content["refusal"])
    hi = "1 (this party is private: one score column)" if private else "1000"
    assert rep["code"] == "invalid" and rep["reason"].startswith("party 1: " + text.format(hi=hi))
    if private:
        assert PartyStore(tmp_path).count() == 0                # nothing charged


# --------------------------------------------------------------- PSI handlers' fields
def _psi_msg(fields):
    return Message(RecordDict({"psi": ConfigRecord(fields)}), dst_node_id=7, message_type="query")


@pytest.mark.parametrize("handler, fields, text", [
    (psi_party.psi_answer, {"split": "train", "request": 10**9},
     "message field psi['request']=1000000000 is refused; expected bytes"),
    (psi_party.psi_answer, {"split": "valid", "request": b""},
     "message field psi['split']='valid' is refused; expected one of ('train', 'test', 'score')"),
    (psi_party.psi_answer, {"split": "train", "request": b"", "fpr": float("nan")},
     "message field psi['fpr']=nan is refused; expected a number in (0, 1)"),
    (psi_party.psi_answer, {"split": "train", "request": b"", "structure": "tree"},
     "message field psi['structure']='tree' is refused; expected one of ('raw', 'gcs', 'bloom')"),
    (psi_party.psi_answer, {"split": "train"}, "message field psi['request'] is missing"),
    (psi_party.psi_order, {"split": "train", "order": 5, "digest": "x"},
     "message field psi['order']=5 is refused; expected bytes"),
    (psi_party.psi_order, {"split": "train", "order": b"{}", "digest": "x"},
     "the agreed train order does not decode to a list of IDs"),
])
def test_psi_fields_are_checked_before_anything_is_read(tmp_path, handler, fields, text):
    nc = {"partition-id": 1, "data-path": str(tmp_path / "missing.csv"), "id-column": "id",
          "state-dir": str(tmp_path / "s")}
    with pytest.raises(Exception) as exc:
        handler(_psi_msg(fields), ctx(nc))
    assert str(exc.value) == f"party 1: {text}"
    assert not (tmp_path / "s").exists()                    # nothing counted


# --------------------------------------------------------------- the PLD accountant is bounded
def test_pld_on_gaussian_releases_is_the_closed_form_and_fast():
    t = time.perf_counter()
    z = accounting.noise_multiplier_for(100.0, DELTA, 100, "pld")          # was > 10 min
    spent = accounting.epsilon_for_events([("gaussian", z)] * 100, DELTA, "pld")
    took = time.perf_counter() - t
    assert z == accounting.noise_multiplier_for(100.0, DELTA, 100, "exact")
    assert spent == accounting.epsilon_for_events([("gaussian", z)] * 100, DELTA, "exact") <= 100.0
    assert spent == pytest.approx(100.0, rel=1e-3)
    assert took < 5.0, took                                                # measured 0.01 s


def test_a_mixed_pld_widens_its_interval_and_stays_an_upper_bound():
    groups = ((("gaussian", 0.3), 10), (("laplace", 0.1), 10))
    assert accounting.pld_interval(groups) == pytest.approx(
        (100.0 + accounting._eps_exact([0.3] * 10, 1e-12)) / accounting.PLD_MAX_POINTS)
    assert accounting.pld_interval(((("gaussian", 3.0), 2), (("laplace", 5.0), 3))) == accounting.PLD_DISCRETIZATION
    eps = accounting._eps_mixed(groups, DELTA)
    # at least the Gaussian part alone and at most basic composition of both parts
    assert accounting._eps_exact([0.3] * 10, DELTA) < eps <= 100.0 + accounting._eps_exact([0.3] * 10, DELTA / 2) + 1e-9


# --------------------------------------------------------------- a state folder that cannot be written
def test_a_state_dir_that_is_a_file_is_named(tmp_path):
    plain = tmp_path / "state"
    plain.write_text("not a folder")
    with pytest.raises(StoreDiskError) as exc:
        send(ca.train, ctx(node(plain)), {})
    assert str(exc.value) == (f"the party's state-dir {plain} is a file, not a folder. Set the node-config key "
                              "state-dir to a folder on this party's disk (it is created if missing)")
    with pytest.raises(StoreDiskError) as exc:
        send(ca.identify, ctx(node(plain / "sub")), {})
    assert str(exc.value).startswith(f"cannot create the party's state-dir {plain / 'sub'}: Not a directory. Set "
                                     "the node-config key state-dir to a writable folder")
    assert plain.read_text() == "not a folder"


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MB tmpfs of our own (root only: mounting needs CAP_SYS_ADMIN)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (CAP_SYS_ADMIN); this machine cannot")
    yield mnt
    close_stores()
    subprocess.run(["umount", "--lazy", str(mnt)], check=True)   # the block cache may still map a file


def _remount(mnt, mode):
    close_stores()                          # a SuperNode's message process has ended
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True)


def test_a_read_only_state_dir_is_named_and_the_ledger_stays_valid(small_fs):
    state = small_fs / "party1"
    for rnd in (1, 2):
        assert "release" in send(ca.train, ctx(node(state)), {"round": rnd}).content
    _remount(small_fs, "ro")
    with pytest.raises(StoreDiskError) as exc:
        send(ca.train, ctx(node(state)), {"round": 3})
    assert str(exc.value).startswith(f"cannot open the party's ledger {state / 'party.sqlite'}: ")
    assert "Set the node-config key state-dir to a writable folder with free space" in str(exc.value)
    assert str(exc.value).endswith("nothing already written there is lost (every committed release stays in the "
                                   "ledger and its journal)")
    _remount(small_fs, "rw")
    check = journal_check(state)
    assert (check["journaled"], check["in_ledger"], check["missing"]) == (2, 2, 0)
    assert "release" in send(ca.train, ctx(node(state)), {"round": 3}).content   # resumes, same ledger
    store = PartyStore(state)
    assert store.count() == 3
    store.close()


def test_a_full_state_dir_is_named_and_loses_nothing(small_fs):
    state = small_fs / "party1"
    assert "release" in send(ca.train, ctx(node(state)), {"round": 1}).content
    close_stores()
    filler = small_fs / "filler"
    with open(filler, "wb", buffering=0) as fh:       # fill the filesystem to the last block
        try:
            while True:
                fh.write(b"\1" * 4096)
        except OSError:
            pass
    with pytest.raises(StoreDiskError) as exc:
        send(ca.train, ctx(node(state)), {"round": 2})
    assert "Set the node-config key state-dir to a writable folder with free space" in str(exc.value)
    filler.unlink()
    close_stores()
    check = journal_check(state)
    assert (check["missing"], check["in_ledger"]) == (0, 1) and check["journaled"] >= 1
    assert "release" in send(ca.train, ctx(node(state)), {"round": 2}).content
    store = PartyStore(state)
    assert store.count() == 2
    store.close()


# --------------------------------------------------------------- label store and PSI log: loud when lost
def _psi_party(tmp_path):
    from flower_vfl.io.bundled import write_table
    ids = [f"c{i:04d}" for i in range(60)]
    X = np.random.default_rng(0).standard_normal((60, 2))
    path = write_table(tmp_path / "bank.csv", ids, X, ["f1", "f2"], "csv", id_column="id")
    return ids, {"partition-id": 1, "data-path": str(path), "id-column": "id", "psi-max-asked": 2.0,
                 "state-dir": str(tmp_path / "state")}


def _ask(nc, owner_ids, run):
    from flower_vfl.io import psi
    lo = psi.LabelOwnerPSI(owner_ids, key="fresh")
    msg = Message(RecordDict({"psi": ConfigRecord({"split": "train", "request": lo.request(), "fpr": 1e-9,
                                                   "structure": "raw"})}), dst_node_id=7,
                  message_type="query.psi_answer")
    return psi_party.psi_answer(msg, ctx(nc, run))


def _rm_sqlite(path):
    for suffix in ("", "-wal", "-shm"):
        (path.parent / (path.name + suffix)).unlink(missing_ok=True)


def test_a_deleted_psi_log_refuses_to_start_until_the_operator_accepts(tmp_path, capsys):
    from flower_vfl.cli import commands as cli
    from flower_vfl.privacy.store import LedgerMissing
    ids, nc = _psi_party(tmp_path)
    _ask(nc, ids[:40], 1)
    _ask(nc, ids[20:50], 2)
    state = tmp_path / "state"
    journal = [line for line in (state / "psi-log.journal").read_text().splitlines()]
    assert journal[0] == '{"flower-vfl-count-journal": 1, "table": "asked"}' and journal[-1] == "[70]"   # a fresh key each request: 40 + 30 items
    _rm_sqlite(state / "psi-log.sqlite")
    with pytest.raises(LedgerMissing) as exc:                  # a new run, through the real handler
        _ask(nc, ids[:40], 3)
    assert str(exc.value) == (
        f"the party's PSI log {state / 'psi-log.sqlite'} is missing, but its journal {state / 'psi-log.journal'} "
        f"records 70 row(s) there: this state folder was in use, and starting empty would forget them. Refused. "
        f"If the loss is known and accepted (the spent budget is then forgotten), run `flower-vfl ledger "
        f"--state-dir {state} --accept-reset`; otherwise restore the file from a backup first")
    assert not (state / "psi-log.sqlite").exists()
    capsys.readouterr()
    assert cli.main(["ledger", "--state-dir", str(state)]) == 3          # the operator's view says so
    assert capsys.readouterr().err.startswith(
        f"flower-vfl ledger: {state / 'psi-log.sqlite'} holds 0 row(s) but its journal {state / 'psi-log.journal'} "
        "recorded 70; the party refuses to use it. Restore the file, or accept the loss with --accept-reset")
    assert cli.main(["ledger", "--state-dir", str(state), "--accept-reset"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"flower-vfl ledger: reset accepted for {state / 'psi-log.sqlite'}: what it lost is "
                          f"forgotten; the old journal is kept at {state / 'psi-log.journal'}.reset-")
    assert not (state / "party.sqlite").exists()               # no party ledger made up on the way
    assert "psi" in _ask(nc, ids[:40], 3).content              # starts over, as the operator accepted


def test_a_label_store_replaced_by_an_older_copy_is_refused(tmp_path):
    from flower_vfl.privacy.label_dp import LabelStore, label_source
    from flower_vfl.privacy.store import LedgerMissing
    state = tmp_path / "owner"
    src = label_source(dataset="breast_cancer")
    store = LabelStore(state)
    store.draw(src, np.array([0, 1] * 20), 1.0)                 # 40 labels drawn
    store.close()
    shutil.copy(state / "label-store.sqlite", tmp_path / "old.sqlite")
    store = LabelStore(state)
    store.draw(src, np.array([0, 1] * 30), 1.0)                 # 20 more: 60
    store.close()
    _rm_sqlite(state / "label-store.sqlite")
    shutil.copy(tmp_path / "old.sqlite", state / "label-store.sqlite")
    with pytest.raises(LedgerMissing) as exc:
        LabelStore(state)
    assert str(exc.value).startswith(
        f"the label owner's label store {state / 'label-store.sqlite'} holds 40 row(s) but its journal "
        f"{state / 'label-store.journal'} recorded 60; the file was replaced or its write-ahead log lost")
    _rm_sqlite(state / "label-store.sqlite")
    with pytest.raises(LedgerMissing, match="is missing, but its journal .* records 60 row"):
        LabelStore(state)
    assert not (state / "label-store.sqlite").exists()


# --------------------------------------------------------------- a horizontal agent's round fields
@pytest.mark.parametrize("change, text", [
    ({"t": -3}, "agent 0: config['t']=-3 must be an integer in 1..1000000; refused, nothing charged"),
    ({"t": 10**9}, "agent 0: config['t']=1000000000 must be an integer in 1..1000000; refused, nothing charged"),
    ({"I": 10**15}, "agent 0: config['I']=1000000000000000 must be an integer in 112..1000000000000 (at least this "
                    "agent's 112 samples); refused, nothing charged"),
    ({"P": 0}, "agent 0: config['P']=0 must be an integer in 1..100000; refused, nothing charged"),
    ({"rho": float("inf")}, "agent 0: config['rho']=inf is outside the protocol's range (0, 1e+12]; refused, "
                            "nothing charged"),
    ({"a": "1"}, "agent 0: config['a']='1' is not a number"),
    ({"variant": 3}, "agent 0: config['variant']=3 must be a string"),
    ({"variant": "nope"}, "agent 0: the message's settings are refused: variant='nope'; choose one of "),
    ({"final": "no"}, "agent 0: config['final']='no' is not a boolean; send true or false"),
    ({"t": None}, "message field config['t'] is missing"),
])
def test_a_horizontal_agent_checks_every_round_field(change, text):
    from sklearn.datasets import load_digits
    from flower_vfl.clients import DPIADMMClient
    from flower_vfl.clients.dpiadmm import agent_privacy_from_node_config
    X, y = load_digits(return_X_y=True)
    keep = y < 3
    X, y = X[keep][:112] / 16.0, y[keep][:112]
    cfg = {"t": 1, "rho": 7.0, "variant": "objt", "a": 1.0, "beta": 1e-4, "box": 1.0, "trust": "paper", "I": 450,
           "P": 4, "final": False, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    msg = Message(RecordDict({"config": ConfigRecord(cfg), "arrays": ArrayRecord({"w": Array(np.zeros((64, 3)))})}),
                  dst_node_id=100, message_type="train")
    context = Context(run_id=1, node_id=100, node_config={}, state=RecordDict(), run_config={})
    agent = DPIADMMClient(0, X, y, 3, agent_privacy_from_node_config({"partition-id": 0}))
    with pytest.raises(InvalidMessage) as exc:
        agent.train(msg, context)
    got = str(exc.value)
    assert (got.startswith(text) if text.endswith(" ") else got == text), got
    assert "hz.agent" not in context.state


# --------------------------------------------------------------- the horizontal ServerApp's out-dir
def test_a_horizontal_out_dir_that_cannot_be_written_is_refused_before_any_round(tmp_path):
    from flower_vfl.apps.horizontal import writable_out_dir
    plain = tmp_path / "out"
    plain.write_text("x")
    with pytest.raises(ConfigError) as exc:
        writable_out_dir(str(plain))
    assert str(exc.value) == (f"out-dir {plain} is a file, not a folder; set the run-config key out-dir to a "
                              "writable folder with free space (it is created if missing)")
    with pytest.raises(ConfigError) as exc:
        writable_out_dir(str(plain / "sub"))
    assert str(exc.value) == (f"out-dir {plain / 'sub'} cannot be written (Not a directory); set the run-config key "
                              "out-dir to a writable folder with free space (it is created if missing)")
    writable_out_dir(str(tmp_path / "new" / "out"))
    assert list((tmp_path / "new" / "out").iterdir()) == []              # the probe is gone


def test_a_read_only_out_dir_is_refused(small_fs):
    from flower_vfl.apps.horizontal import writable_out_dir
    (small_fs / "kept.txt").write_text("earlier run")
    _remount(small_fs, "ro")
    with pytest.raises(ConfigError) as exc:
        writable_out_dir(str(small_fs))
    assert str(exc.value) == (f"out-dir {small_fs} cannot be written (Read-only file system); set the run-config "
                              "key out-dir to a writable folder with free space (it is created if missing)")
    assert (small_fs / "kept.txt").read_text() == "earlier run"
    _remount(small_fs, "rw")
