"""The warm SuperExec (flower_vfl.deploy.warm_exec) on real Flower processes (slow): TLS to the
SuperLink, registered SuperNode keys bound to parties, ``--isolation process`` with each
message's ClientApp forked from the warm process: the run completes with the in-process
engine's decision values (1e-9) and no process is left."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from flower_vfl import VerticalADMM
from flower_vfl.io.data import labels, party_block
from flower_vfl.deploy.local import Processes, any_alive, deploy_local

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flower-superlink") is None, reason="Flower binaries not on PATH")
def test_warm_isolation_end_to_end_matches_the_engine(tmp_path):
    procs = Processes(tmp_path / "logs")
    try:
        res = deploy_local(tmp_path, 2, {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 3},
                           app_dir=ROOT, processes=procs, timeout=900, isolation="warm")
    finally:
        procs.stop_all()
    assert res["exit_code"] == 0, res["record"]
    blocks = [party_block("breast_cancer", m, 2) for m in range(2)]
    y, _ = labels("breast_cancer")
    ref = VerticalADMM(lam=1e-4, max_rounds=3, tol=0).fit([b[0] for b in blocks], y) \
        .decision_function([b[1] for b in blocks])
    assert np.max(np.abs(np.load(Path(res["out_dir"]) / "decision_test.npy") - ref)) <= 1e-9
    # served by the warm process (its children log there), not by a flwr-clientapp interpreter
    assert "Start `flwr-clientapp` process" not in (tmp_path / "logs" / "node0.log").read_text()
    assert (tmp_path / "logs" / "exec0.log").is_file()
    assert any_alive(procs.started) == []


def test_unknown_isolation_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"isolation='thread'; choose one of \('subprocess', 'warm'\)"):
        deploy_local(tmp_path, 2, {}, isolation="thread")


def test_supernode_launcher_caps_only_flowers_idle_sleep(monkeypatch):
    """flower-vfl-supernode --hot-poll 0: inside Flower's SuperNode loop module every sleep (the
    hard-coded 3 s idle sleep, the 0.5 s reply waits) is capped at --idle-poll; ``time`` elsewhere
    is untouched."""
    import time

    import flwr.supernode.start_client_internal as sci

    from flower_vfl.deploy import supernode

    monkeypatch.setattr(sci, "time", time)          # undone after the test
    monkeypatch.setattr(sci, "_push_messages", sci._push_messages)
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    assert supernode.cap_idle_sleep(0.25) is True
    sci.time.sleep(3)
    sci.time.sleep(0.5)
    time.sleep(3)
    assert slept == [0.25, 0.25, 3]
    assert supernode.cap_idle_sleep(0.5) is True    # patching twice only moves the cap
    sci.time.sleep(3)
    sci.time.sleep(0.5)
    assert slept[3:] == [0.5, 0.5]
    assert sci.time.monotonic is time.monotonic     # everything else is the time module's


def test_supernode_hot_poll_after_a_reply(monkeypatch):
    """--hot-poll: the idle sleep is --idle-poll until the node sent a reply (Flower's
    _push_messages returned), then --hot-poll for HOT_WINDOW_S; the waits for the ClientApp's reply
    are REPLY_POLL_S."""
    import time

    import flwr.supernode.start_client_internal as sci

    from flower_vfl.deploy import supernode

    monkeypatch.setattr(sci, "time", time)
    pushed = []
    monkeypatch.setattr(sci, "_push_messages", lambda *a, **k: pushed.append(a))
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    assert supernode.cap_idle_sleep(0.5, 0.02) is True
    sci.time.sleep(3)                                # idle, nothing handled yet
    sci._push_messages("state")                      # Flower's loop sent a reply
    sci.time.sleep(3)
    sci.time.sleep(0.5)
    now[0] += supernode.HOT_WINDOW_S + 0.01           # the window is over
    sci.time.sleep(3)
    assert pushed == [("state",)]
    assert slept == [0.5, 0.02, supernode.REPLY_POLL_S, 0.5]


def test_supernode_patch_refuses_another_flower_release(monkeypatch):
    import time

    import flwr
    import flwr.supernode.start_client_internal as sci

    from flower_vfl.deploy import supernode

    monkeypatch.setattr(sci, "time", time)
    monkeypatch.setattr(flwr, "__version__", "1.99.0")
    with pytest.warns(UserWarning, match=r"flower-vfl-supernode: flwr 1\.99\.0 is not one of 1\.41\.x, 1\.42\.x; "
                                         r"running Flower's SuperNode unpatched"):
        assert supernode.cap_idle_sleep(0.5, 0.02) is False
    assert sci.time is time
    with pytest.warns(UserWarning, match=r"flwr 1\.99\.0's object pulls .* Flower's own retry backoff \(1 s\) is kept"):
        assert supernode.fast_object_retries() is False


def test_fast_object_retries_sets_only_the_backoff(monkeypatch):
    from flwr.supercore.inflatable import inflatable_utils as iu

    from flower_vfl.deploy import supernode

    for f in (iu.pull_objects, iu.pull_and_inflate_object_from_tree):
        monkeypatch.setattr(f, "__kwdefaults__", dict(f.__kwdefaults__))
    before = dict(iu.pull_objects.__kwdefaults__)
    assert before["initial_backoff"] == 1 and before["backoff_cap"] == 10      # Flower's
    assert supernode.fast_object_retries() is True
    after = iu.pull_objects.__kwdefaults__
    assert (after["initial_backoff"], after["backoff_cap"]) == (supernode.OBJECT_RETRY_S, supernode.OBJECT_RETRY_CAP_S)
    assert {k: v for k, v in after.items() if k not in ("initial_backoff", "backoff_cap")} == \
        {k: v for k, v in before.items() if k not in ("initial_backoff", "backoff_cap")}
    assert iu.pull_and_inflate_object_from_tree.__kwdefaults__["initial_backoff"] == supernode.OBJECT_RETRY_S


def test_warm_exec_task_poll_is_hot_after_a_launch(monkeypatch):
    import time

    from flower_vfl.deploy import warm_exec

    now = [50.0]
    slept = []
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = warm_exec._HotTime()
    clock.sleep(0.2)                                  # Flower's interval until a task came
    clock.active()
    clock.sleep(0.2)
    now[0] += warm_exec.HOT_WINDOW_S + 0.01
    clock.sleep(0.2)
    assert slept == [0.2, warm_exec.HOT_TASK_POLL_S, 0.2]


def test_warm_exec_reuses_a_fab_it_installed(monkeypatch, tmp_path):
    """A forked ClientApp does not extract and verify the same FAB bytes again once Flower's own
    install of them succeeded; other bytes are installed by Flower."""
    import flwr.supernode.runtime.run_clientapp as rc

    from flower_vfl.deploy import warm_exec

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    calls = []

    def flower_install(fab, install_dir=None, skip_prompt=False):
        calls.append(fab)
        path = tmp_path / "apps" / f"app-{len(calls)}"
        path.mkdir(parents=True)
        (path / "pyproject.toml").write_text("")
        return path

    monkeypatch.setattr(rc, "install_from_fab", flower_install)
    warm_exec._reuse_installed_fabs()
    assert rc.install_from_fab(b"fab one", skip_prompt=True) == tmp_path / "apps" / "app-1"
    assert rc.install_from_fab(b"fab one", skip_prompt=True) == tmp_path / "apps" / "app-1"
    assert rc.install_from_fab(b"fab two", skip_prompt=True) == tmp_path / "apps" / "app-2"
    assert calls == [b"fab one", b"fab two"]
    (tmp_path / "apps" / "app-1" / "pyproject.toml").unlink()      # gone from disk: installed again
    assert rc.install_from_fab(b"fab one", skip_prompt=True) == tmp_path / "apps" / "app-3"


@pytest.mark.parametrize("argv, message", [
    (["--idle-poll", "0"], "--idle-poll='0' is out of range; give seconds between 0.05 and 3.0 (default 0.5)"),
    (["--idle-poll=fast"], "--idle-poll='fast' is not a number; give seconds between 0.05 and 3.0 (default 0.5)"),
    (["--idle-poll"], "--idle-poll needs a value in seconds (default 0.5)"),
])
def test_supernode_launcher_refuses_a_bad_idle_poll(argv, message, capsys):
    from flower_vfl.deploy import supernode

    assert supernode.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"flower-vfl-supernode: {message}"


def test_deploy_local_refuses_a_bad_idle_poll(tmp_path):
    with pytest.raises(ValueError, match=r"^--idle-poll=5 is out of range"):
        deploy_local(tmp_path, 2, {"dataset": "breast_cancer"}, idle_poll=5)
