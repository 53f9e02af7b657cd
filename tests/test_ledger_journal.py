"""A missing ledger is loud (issue 20, item 8): a party whose state folder was in use and whose
SQLite ledger is now missing, replaced by an older copy or cut short by a lost WAL refuses to
start, through the real ClientApp handlers, until its operator runs
``flower-vfl ledger --state-dir D --accept-reset``. The journal lives on the party's own disk:
this guards against accidents there, not against the server (which never touches the disk)."""

import json
import shutil

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from flower_vfl.apps import client as ca
from flower_vfl.clients import party_private
from flower_vfl.cli import commands as cli
from flower_vfl.privacy import epsilon_for_releases, noise_multiplier_for
from flower_vfl.privacy.store import LedgerMissing, PartyStore

from _party_handlers import DELTA, N, RC, _task_identity  # noqa: F401  (_task_identity: autouse)


def node(tmp_path):
    return {"partition-id": 1, "dp": True, "dp-epsilon": 1.0, "dp-train-rounds": 4, "dp-eval-rounds": 0,
            "state-dir": str(tmp_path / "party1")}


def train(nc, run, rnd):
    context = Context(run_id=run, node_id=7, node_config=dict(nc), state=RecordDict(), run_config=dict(RC))
    rng = np.random.default_rng(rnd)
    rd = RecordDict({"config": ConfigRecord({"round": rnd, "rho": 1e-3, "alpha": 1.0, "theta": 0.5}),
                     "vectors": ArrayRecord({"q": Array(rng.normal(size=N) * 0.1),
                                             "y": Array(rng.normal(size=N) * 1e-4)})})
    return ca.train(Message(rd, dst_node_id=7, message_type="train"), context)


def close_stores():
    """The SuperNode process ends (each message is a fresh process on a real SuperNode)."""
    for store in party_private.OPEN_STORES.values():
        store.close()
    party_private.OPEN_STORES.clear()


def ledger_cli(nc, *extra):
    return cli.main(["ledger", "--state-dir", nc["state-dir"], *extra])


def spent(nc):
    store = PartyStore(nc["state-dir"])
    zs = [e.noise_multiplier for src, _ in store.sources() for e in store.entries(src)]
    store.close()
    return epsilon_for_releases(zs, DELTA), len(zs)


def test_a_deleted_ledger_refuses_to_start_until_the_operator_accepts(tmp_path, capsys):
    nc = node(tmp_path)
    z = noise_multiplier_for(1.0, DELTA, 4)
    for rnd in (1, 2, 3):
        assert "release" in train(nc, 1, rnd).content
    close_stores()
    (tmp_path / "party1" / "party.sqlite").unlink()              # the operator's disk lost the file
    for suffix in ("-wal", "-shm"):
        (tmp_path / "party1" / f"party.sqlite{suffix}").unlink(missing_ok=True)
    with pytest.raises(LedgerMissing) as exc:                    # a new run, through the real handler
        train(nc, 2, 1)
    assert str(exc.value).startswith(f"the party's ledger {tmp_path / 'party1' / 'party.sqlite'} is missing, but "
                                     f"its journal {tmp_path / 'party1' / 'party.journal'} names 3 release(s)")
    assert f"flower-vfl ledger --state-dir {tmp_path / 'party1'} --accept-reset" in str(exc.value)
    assert not (tmp_path / "party1" / "party.sqlite").exists()   # nothing was created by the refusal
    capsys.readouterr()
    assert ledger_cli(nc) == 3
    assert "is MISSING, but its journal names 3 charged release(s)" in capsys.readouterr().err
    assert ledger_cli(nc, "--accept-reset") == 0
    out = capsys.readouterr().out
    assert "the journal named 3 release(s), the ledger holds 0; 3 are forgotten" in out
    assert list((tmp_path / "party1").glob("party.journal.reset-*"))         # the old journal is kept
    assert "release" in train(nc, 2, 1).content                  # accepted: the party starts again
    assert spent(nc) == (pytest.approx(epsilon_for_releases([z], DELTA), rel=1e-12), 1)


def test_a_lost_wal_is_a_short_ledger_and_is_refused(tmp_path, capsys):
    """Rounds 1-2 reach the main file (checkpoint), round 3 lives only in the WAL; the WAL is lost:
    the ledger holds 2 of the 3 journaled releases, and the next run is refused."""
    nc = node(tmp_path)
    d = tmp_path / "party1"
    for rnd in (1, 2):
        train(nc, 1, rnd)
    close_stores()                                               # last connection closed: checkpointed
    saved = d / "saved.sqlite"
    shutil.copy(d / "party.sqlite", saved)                       # the main file as it was before round 3
    train(nc, 1, 3)
    close_stores()
    shutil.copy(saved, d / "party.sqlite")                       # round 3 was only in the lost WAL
    for suffix in ("-wal", "-shm"):
        (d / f"party.sqlite{suffix}").unlink(missing_ok=True)
    with pytest.raises(LedgerMissing, match=r"holds 2 release\(s\) but its journal .* names 3; 1 charged "
                                            r"release\(s\) are gone"):
        train(nc, 2, 1)
    capsys.readouterr()
    assert cli.main(["ledger", "--state-dir", nc["state-dir"], "--json"]) == 3
    rep = json.loads(capsys.readouterr().out)
    assert rep["journal"]["journaled"] == 3 and rep["journal"]["in_ledger"] == 2 and rep["journal"]["missing"] == 1
    assert ledger_cli(nc, "--accept-reset") == 0
    # run 1 goes on (its plan of 4 holds 2 releases now); a new run's plan of 4 would not fit
    assert "release" in train(nc, 1, 4).content
    assert spent(nc)[1] == 3


def test_the_journal_does_not_refuse_an_intact_ledger_or_a_fresh_folder(tmp_path):
    """A store opened many times (a fresh process per message), and a folder never used, start
    without a word; a journal lagging behind its ledger (a crash between commit and journal line) heals."""
    nc = node(tmp_path)
    for rnd in (1, 2):
        train(nc, 1, rnd)
        close_stores()
    lines = (tmp_path / "party1" / "party.journal").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0]) == {"flower-vfl-journal": 1}
    (tmp_path / "party1" / "party.journal").write_text(lines[0] + "\n" + lines[1] + "\n")   # lost the last line
    assert spent(nc)[1] == 2
    assert len((tmp_path / "party1" / "party.journal").read_text().splitlines()) == 3          # healed
    assert "release" in train(node(tmp_path / "fresh"), 1, 1).content


def test_flower_vfl_ledger_shows_the_label_ledger_and_the_psi_log(tmp_path, capsys):
    """One state folder holding a party's ledger, a label owner's label store and a PSI log:
    `flower-vfl ledger` shows all three (the ε of each from the code that charged it)."""
    from flower_vfl.io.psi_log import PsiLog, source_key
    from flower_vfl.privacy.label_dp import LabelStore, label_epsilon_spent, label_source

    nc = node(tmp_path)
    train(nc, 1, 1)
    labels = LabelStore(nc["state-dir"])
    y = np.array([0, 1] * 50)
    for run in range(3):                                         # three runs reuse one draw
        labels.draw(label_source(dataset="breast_cancer"), y, 1.0)
    labels.close()
    log = PsiLog(nc["state-dir"])
    src = source_key(str(tmp_path / "bank.csv"), "id")
    log.record(src, "request", [f"x{i}" for i in range(40)], own_size=50, factor=1.0, run=1)
    log.record(src, "request", [f"x{i}" for i in range(20, 45)], own_size=50, factor=1.0, run=2)
    log.close()
    capsys.readouterr()
    assert ledger_cli(nc) == 0
    out = capsys.readouterr().out
    z = noise_multiplier_for(1.0, DELTA, 4)
    assert f"1 releases over 1 run(s); spent ε={epsilon_for_releases([z], DELTA):.4g}" in out
    assert (f"labels bundled:breast_cancer: one randomized response at ε_label=1 (flip probability "
            f"{1 / (1 + np.e):.4g}), 100 label(s) drawn, reused by 3 run(s); "
            f"spent ε={label_epsilon_spent(1.0):.4g}") in out
    assert f"PSI {src} (request): 45 distinct ID(s) asked of a cap of 50 (own set 50); 2 answer(s), 0 refused" in out
    assert ledger_cli(nc, "--json") == 0
    rep = json.loads(capsys.readouterr().out)
    assert [r["labels_drawn"] for r in rep["labels"]] == [100] and [r["distinct_asked"] for r in rep["psi"]] == [45]
    assert rep["journal"]["missing"] == 0 and len(rep["sources"]) == 1
