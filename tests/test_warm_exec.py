"""The warm SuperExec (flower_vfl.deploy.warm_exec) on real Flower processes (slow): TLS to the
SuperLink, registered SuperNode keys bound to parties, ``--isolation process`` with each
message's ClientApp forked from the warm process: the run completes with the in-process
engine's decision values (1e-9) and no process is left."""

import os
import re
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
@pytest.mark.parametrize("packaged", [False, True], ids=["checkout-bundle", "packaged-app"])
def test_warm_isolation_end_to_end_matches_the_engine(tmp_path, packaged):
    """The checkout as the app (the bundle carries flower_vfl/**.py) and the app folder the package
    ships (only pyproject.toml; the ClientApp is the installed package): both preloaded."""
    import flower_vfl
    from flower_vfl.cli.app import app_dir

    procs = Processes(tmp_path / "logs")
    try:
        res = deploy_local(tmp_path, 2, {"dataset": "breast_cancer", "num-parties": 2, "max-rounds": 3},
                           app_dir=app_dir() if packaged else ROOT, processes=procs, timeout=900, isolation="warm")
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
    # the first message's process imported our app; the warm process then imported its modules
    exec_log = (tmp_path / "logs" / "exec0.log").read_text()
    where = re.escape(str(Path(flower_vfl.__file__).resolve().parents[1])) + r" here" if packaged \
        else r"\S*/apps/flower-vfl\.flower-vfl\.\S+ here"
    assert re.search(r"INFO[^\n]{0,24}\[warm_exec\] imported \d+ modules of the app in " + where, exec_log), exec_log[-3000:]
    # after the first message installed the app bundle, the node sent it without content (fab-skip)
    from flower_vfl.deploy.installed_fab import SKIP_LINE
    assert re.search(re.escape(SKIP_LINE).replace("%s", "[0-9a-f]{12}"),
                     (tmp_path / "logs" / "node0.log").read_text()), "node0.log: no FAB sent without content"
    # the run's ServerApp was forked by the SuperLink's warm executor (--isolation process), not a
    # flwr-serverapp interpreter
    server_log = (tmp_path / "logs" / "server-exec.log").read_text()
    assert re.search(r"\[warm_exec\] task \d+: forked ServerApp and its exit handlers done in [\d.]+ s \(exit 0\)",
                     server_log), server_log[-3000:]
    assert "Start `flwr-serverapp` process" not in server_log + (tmp_path / "logs" / "superlink.log").read_text()
    # its last log lines reached the SuperLink before the final status (the shortened flush_logs)
    assert re.search(r"final \(round 3\): test_loss=[\d.]+", (tmp_path / "logs" / "run.log").read_text())
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
    monkeypatch.setattr(sci, "_pull_and_store_message", sci._pull_and_store_message)
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
    monkeypatch.setattr(sci, "_pull_and_store_message", sci._pull_and_store_message)
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
    with pytest.warns(UserWarning, match=r"^flower-vfl: Flower patch 'supernode-poll' not applied \(flwr 1\.99\.0 is "
                                         r"not one of 1\.41\.x, 1\.42\.x\); running Flower's SuperNode unpatched"):
        assert supernode.cap_idle_sleep(0.5, 0.02) is False
    assert sci.time is time
    with pytest.warns(UserWarning, match=r"^flower-vfl: Flower patch 'object-retry-backoff' not applied \(flwr 1\.99\.0 "
                                         r".*\); Flower's own retry backoff \(1 s\) is kept$"):
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
    monkeypatch.setattr(rc, "pull_task_input", rc.pull_task_input)     # fab-announce: undone after
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


@pytest.mark.parametrize("argv, message", [
    (["--heartbeat", "5"], "--heartbeat='5': seconds between heartbeats must be in [10, 1800] (the SuperLink "
                           "refuses others); leave it out for Flower's 30 s"),
    (["--heartbeat=often"], "--heartbeat='often': seconds between heartbeats must be in [10, 1800] (the "
                            "SuperLink refuses others); leave it out for Flower's 30 s"),
    (["--heartbeat"], "--heartbeat needs a value in seconds (default Flower's 30)"),
])
def test_supernode_launcher_refuses_a_bad_heartbeat(argv, message, capsys):
    from flower_vfl.deploy import supernode

    assert supernode.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"flower-vfl-supernode: {message}"


def test_supernode_heartbeat_sets_the_interval_the_node_announces_and_keeps(monkeypatch):
    """--heartbeat 10: both of Flower's copies of the interval (the one sent to the SuperLink at
    activation and heartbeat, and the one the heartbeat loop paces itself by) say 10; another
    Flower release keeps 30 and says so."""
    import flwr
    import flwr.supercore.heartbeat as hb
    import flwr.supernode.fleet_http_connection as conn

    from flower_vfl.deploy import supernode

    for m in (conn, hb):
        monkeypatch.setattr(m, "HEARTBEAT_DEFAULT_INTERVAL", 30)
    assert supernode._split_args(["--heartbeat", "10", "--insecure"])[2:] == (10.0, ["--insecure"])
    assert supernode._split_args(["--insecure"])[2] is None
    assert supernode.set_heartbeat(10) is True
    assert conn.HEARTBEAT_DEFAULT_INTERVAL == hb.HEARTBEAT_DEFAULT_INTERVAL == 10.0
    for m in (conn, hb):
        monkeypatch.setattr(m, "HEARTBEAT_DEFAULT_INTERVAL", 30)
    monkeypatch.setattr(flwr, "__version__", "1.99.0")
    with pytest.warns(UserWarning, match=r"^flower-vfl: Flower patch 'heartbeat-interval' not applied \(flwr 1\.99\.0 "
                                         r".*\); --heartbeat ignored, Flower's interval kept$"):
        assert supernode.set_heartbeat(10) is False
    assert conn.HEARTBEAT_DEFAULT_INTERVAL == hb.HEARTBEAT_DEFAULT_INTERVAL == 30


def test_deploy_local_refuses_a_bad_idle_poll(tmp_path):
    with pytest.raises(ValueError, match=r"^--idle-poll=5 is out of range"):
        deploy_local(tmp_path, 2, {"dataset": "breast_cancer"}, idle_poll=5)


def _forked(fn):
    """Run ``fn()`` in a forked child; its return value (bytes) back through a pipe."""
    import os

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:                                         # pragma: no cover - the child
        code = 0
        try:
            os.write(wfd, fn())
        except BaseException:                            # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    data = b""
    while chunk := os.read(rfd, 65536):
        data += chunk
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return data


def test_forked_messages_draw_different_noise():
    """Two ClientApps forked from one warm process (after _child_after_fork, as in launch) draw
    different noise through the party's mechanism, and numpy's global RandomState differs too;
    without the reseed the global state would be the same in both (the control)."""
    import numpy as np

    from flower_vfl.deploy import warm_exec
    from flower_vfl.privacy.mechanism import GaussianOutputMechanism

    mech = GaussianOutputMechanism(1.0, party_id=1)
    np.random.seed(7)                                   # a parent whose global state is fixed

    def message(reseed):
        def run():
            if reseed:
                warm_exec._child_after_fork({})
            noise = mech.release(np.zeros(8), round=3, kind="train")
            return np.concatenate([noise, np.random.standard_normal(8)]).tobytes()
        return run

    a, b = (np.frombuffer(_forked(message(True)), dtype=float) for _ in range(2))
    assert np.all(a[:8] != b[:8]) and np.all(a[8:] != b[8:])
    c, d = (np.frombuffer(_forked(message(False)), dtype=float) for _ in range(2))
    assert np.all(c[:8] != d[:8])                       # the mechanism: OS entropy at the draw
    assert np.array_equal(c[8:], d[8:])                 # numpy's global state is shared without it


def _bundle(root, name, value):
    """An installed app bundle: pyproject.toml and package ``vflpre_app`` with ``VALUE``."""
    folder = root / name
    (folder / "vflpre_app").mkdir(parents=True)
    (folder / "pyproject.toml").write_text("")
    (folder / "vflpre_app" / "__init__.py").write_text("")
    (folder / "vflpre_app" / "mod.py").write_text(f"VALUE = {value!r}\n")
    return str(folder)


def test_app_preloader_imports_a_bundle_once_and_children_of_another_bundle_drop_it(tmp_path, monkeypatch):
    """The warm process imports what a finished message of a bundle reported; a bundle with the same
    top-level package replaces it; a child of another bundle drops the preloaded one before Flower's
    load_app, so it imports its own bundle's code; the child reports what it imported."""
    import json
    import os
    import sys

    import flwr.clientapp.utils as cu

    from flower_vfl.deploy import warm_exec

    monkeypatch.setattr(sys, "path", list(sys.path))
    one, two = _bundle(tmp_path, "one", 1), _bundle(tmp_path, "two", 2)
    pre = warm_exec.AppPreloader()
    try:
        assert pre.preload(one, ["vflpre_app.mod"]) == 2          # the package and the module
        assert sys.modules["vflpre_app.mod"].VALUE == 1 and sys.path[0] == one
        assert pre.preload(one, ["vflpre_app.mod"]) == 0          # already imported: nothing to do

        def child_of(folder):
            def run():
                rfd, wfd = os.pipe()
                monkeypatch.setattr(cu, "load_app", lambda ref, err, project_dir=None:
                                    __import__("importlib").import_module("vflpre_app.mod"))
                report = warm_exec._report_bundle_modules(dict(pre.apps), wfd)
                sys.path.insert(0, folder)                         # as Flower's load_app does
                value = cu.load_app("vflpre_app.mod:VALUE", ImportError, folder).VALUE
                report()
                os.close(wfd)
                info = json.loads(os.read(rfd, 65536))
                return json.dumps([value, info["dir"], sorted(info["modules"]), one in sys.path]).encode()
            return run

        assert json.loads(_forked(child_of(one))) == [1, one, ["vflpre_app", "vflpre_app.mod"], True]
        assert json.loads(_forked(child_of(two))) == [2, two, ["vflpre_app", "vflpre_app.mod"], False]
        assert pre.preload(two, ["vflpre_app.mod"]) == 2          # same package: replaces bundle one
        assert list(pre.apps) == [two] and sys.modules["vflpre_app.mod"].VALUE == 2 and one not in sys.path
        broken = _bundle(tmp_path, "broken", 3)
        (Path(broken) / "vflpre_bad.py").write_text("raise RuntimeError('boom')\n")
        with pytest.warns(UserWarning, match=r"importing the app in .*broken failed \(RuntimeError: boom\); "
                                             r"its messages import it themselves"):
            assert pre.preload(broken, ["vflpre_bad"]) == 0
        assert "vflpre_bad" not in sys.modules and broken not in sys.path and pre.preload(broken, ["vflpre_bad"]) == 0
        # an app folder holding only pyproject.toml whose ClientApp is an installed package: the package
        # (its sys.path root, its top-level name only) is preloaded; a bundle that has that package
        # itself shadows it in the child
        site = tmp_path / "site"
        (site / "vflpre_inst").mkdir(parents=True)
        (site / "vflpre_inst" / "__init__.py").write_text("VALUE = 'installed'\n")
        (site / "other_pkg.py").write_text("")
        sys.path.append(str(site))
        assert pre.preload(str(site), ["vflpre_inst", "other_pkg"], {"vflpre_inst"}) == 1
        assert pre.apps[str(site)] == frozenset({"vflpre_inst"}) and "other_pkg" not in sys.modules
        assert warm_exec._shadowed(str(site), frozenset({"vflpre_inst"}), two) is False
        (Path(two) / "vflpre_inst.py").write_text("VALUE = 'bundle'\n")
        assert warm_exec._shadowed(str(site), frozenset({"vflpre_inst"}), two) is True
        assert warm_exec._shadowed(two, None, two) is False and warm_exec._shadowed(one, None, two) is True
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] in ("vflpre_app", "vflpre_bad", "vflpre_inst")]:
            del sys.modules[name]


def test_telemetry_is_off_unless_the_user_set_it(monkeypatch):
    import flwr.supercore.telemetry as tm

    from flower_vfl.deploy import supernode

    monkeypatch.setattr(tm, "FLWR_TELEMETRY_ENABLED", tm.FLWR_TELEMETRY_ENABLED)
    monkeypatch.delenv("FLWR_TELEMETRY_ENABLED", raising=False)
    assert supernode.telemetry_off_by_default() is True
    assert os.environ["FLWR_TELEMETRY_ENABLED"] == "0" and tm.FLWR_TELEMETRY_ENABLED == "0"
    assert tm.create_event(tm.EventType.FLWR_CLIENTAPP_RUN_LEAVE, None) == "disabled"   # nothing sent
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "1")
    assert supernode.telemetry_off_by_default() is False and tm.FLWR_TELEMETRY_ENABLED == "1"


def _refusal(code, detail="Failed to activate SuperNode."):
    import json

    import httpx

    request = httpx.Request("POST", "https://link.invalid/v1/fleet/activate-node")
    response = httpx.Response(412, text=json.dumps({"code": code, "detail": detail}), request=request)
    return httpx.HTTPStatusError("412 Precondition Failed", request=request, response=response)


def test_supernode_retries_a_refused_activation(monkeypatch, caplog):
    """Code 2004 (previous session still online): asked again every 3 s, one log line, up to 65 s,
    then Flower's own error; any other refusal is raised at once; patching twice wraps once."""
    import httpx
    from flwr.supernode.fleet_http_client import FleetHttpClient

    from flower_vfl.deploy import supernode

    answers = []

    def flower_activate(self, request):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(FleetHttpClient, "ActivateNode", flower_activate)
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s

    assert supernode.retry_activation(sleep=sleep, clock=lambda: now[0]) is True
    assert supernode.retry_activation(sleep=sleep, clock=lambda: now[0]) is True      # wraps Flower's once
    answers[:] = [_refusal(2004), _refusal(2004), "node 7"]
    with caplog.at_level("WARNING"):
        assert FleetHttpClient.ActivateNode(None, "request") == "node 7"
    assert slept == [3.0, 3.0]
    lines = [r.getMessage() for r in caplog.records if "refused to activate" in r.getMessage()]
    assert lines == ["flower-vfl-supernode: the SuperLink refused to activate this node ([code: 2004] Failed to "
                     "activate SuperNode.): its previous session is still online until the SuperLink misses its "
                     "heartbeats (up to 60 s after a kill); asking again every 3 s for up to 65 s"]
    answers[:] = [_refusal(2004)] * 30                  # still online after the window: Flower's error
    slept.clear()
    with pytest.raises(httpx.HTTPStatusError) as info:
        FleetHttpClient.ActivateNode(None, "request")
    assert slept == [3.0] * 21 and len(answers) == 30 - 22 and '"code": 2004' in info.value.response.text
    answers[:] = [_refusal(2003, "Invalid heartbeat interval."), "unused"]
    slept.clear()
    with pytest.raises(httpx.HTTPStatusError):
        FleetHttpClient.ActivateNode(None, "request")
    assert slept == [] and answers == ["unused"]


def test_supernode_activation_retry_refuses_another_flower_release(monkeypatch):
    import flwr
    from flwr.supernode.fleet_http_client import FleetHttpClient

    from flower_vfl.deploy import supernode

    flower = FleetHttpClient.ActivateNode
    monkeypatch.setattr(flwr, "__version__", "1.99.0")
    with pytest.warns(UserWarning, match=r"^flower-vfl: Flower patch 'activation-retry' not applied \(flwr 1\.99\.0 is "
                                         r"not one of 1\.41\.x, 1\.42\.x\); a refused activation ends the node at once"):
        assert supernode.retry_activation() is False
    assert FleetHttpClient.ActivateNode is flower


def test_preload_installed_imports_the_package_module_in_the_warm_process():
    """``--preload-package``: the installed package's module is imported at the executor's start
    and registered as a preloaded app (its sys.path root -> its top-level name), so a forked child
    keeps it; a module that is not installed warns and preloads nothing. In a fresh interpreter."""
    import subprocess
    import sys

    code = """
import sys, warnings, json
from flower_vfl.deploy import warm_exec as w
p = w.AppPreloader()
for m in [m for m in sys.modules if m.startswith("flower_vfl.apps")]:
    del sys.modules[m]
n = w.preload_installed(p, "flower_vfl.apps.server")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    n2 = w.preload_installed(p, "no_such_package_here.app")
print(json.dumps({"n": n, "apps": {k: sorted(v) for k, v in p.apps.items()}, "n2": n2,
                  "loaded": "flower_vfl.apps.server" in sys.modules, "warn": [str(c.message) for c in caught]}))
"""
    out = subprocess.run([sys.executable, "-W", "ignore::UserWarning:google", "-c", code], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    import json
    res = json.loads(out.stdout.strip().splitlines()[-1])
    import flower_vfl
    root = str(Path(flower_vfl.__file__).resolve().parents[1])
    assert res["loaded"] is True and res["n"] >= 1
    assert res["apps"] == {root: ["flower_vfl"]}
    assert res["n2"] == 0
    assert res["warn"] == ["flower_vfl.deploy.warm_exec: --preload-package no_such_package_here.app: "
                           "no_such_package_here is not an installed package here; not preloaded"]


def test_forked_serverapp_runs_flowers_serverapp_main(monkeypatch):
    """The ServerApp task's child does what flwr-serverapp's main does after its arguments: its
    output mirrored to a log queue, then Flower's run_serverapp with the task's address, token,
    TLS and parent, and the output restored after (also when run_serverapp exits)."""
    import sys
    from types import SimpleNamespace

    import flwr.superlink.runtime as rt
    import flwr.supercore.logger as lg

    from flower_vfl.deploy import warm_exec

    calls = []
    monkeypatch.setattr(lg, "mirror_output_to_queue", lambda q: calls.append(("mirror", q)))
    monkeypatch.setattr(lg, "restore_output", lambda: calls.append(("restore",)))

    def run_serverapp(**kw):
        calls.append(("run", kw))
        raise SystemExit(0)                       # flwr_exit ends the task with sys.exit

    monkeypatch.setattr(rt, "run_serverapp", run_serverapp)
    spec = SimpleNamespace(runtime_api_address="127.0.0.1:9", token="tok", insecure=False, parent_pid=7,
                           runtime_dependency_install=False)
    with pytest.raises(SystemExit):
        warm_exec._run_serverapp(spec, b"CA")
    assert [c[0] for c in calls] == ["mirror", "run", "restore"]
    kw = calls[1][1]
    assert kw["log_queue"] is calls[0][1]
    assert {k: v for k, v in kw.items() if k != "log_queue"} == {
        "runtime_api_address": "127.0.0.1:9", "token": "tok", "insecure": False, "certificates": b"CA",
        "parent_pid": 7, "runtime_dependency_install": False}
    assert sys.stdout is not None


def test_serverapp_flush_waits_for_the_uploaders_last_push():
    """The forked ServerApp's flush_logs (replacing Flower's fixed 1 s): when it returns, Flower's own
    log uploader thread has pushed every line queued before it, also when a push is slow (0.3 s,
    in flight when the queue empties). Flower's flush_logs of this release is the one recognised."""
    import threading
    import time

    import flwr.supercore.logger as lg

    from flower_vfl.deploy import warm_exec

    assert warm_exec._is_flowers_flush(lg.flush_logs) is True
    assert warm_exec._is_flowers_flush(lambda q, timeout=3.0: True) is False
    pushed = []

    class Client:
        def PushLogs(self, req):                      # noqa: N802 - Flower's method name
            time.sleep(0.3)
            pushed.extend(req.logs)

    for trial in range(3):
        pushed.clear()
        q = warm_exec._DrainQueue()
        t = threading.Thread(target=lg._log_uploader, args=(q, 0, 1, Client()), daemon=True)
        t.start()
        lines = [f"line {trial}.{i}" for i in range(5)]
        for i, line in enumerate(lines):
            q.put(line)
            if i == 2:
                time.sleep(0.25)                      # a push is in flight when the rest arrive
        assert warm_exec._drained_flush(q) is True
        assert pushed == lines
        q.put(None)
        t.join(5)
        assert not t.is_alive()


def test_deploy_local_forks_the_serverapp_from_a_warm_executor_by_default(monkeypatch, tmp_path):
    """deploy-local's SuperLink runs with --isolation process and its ServerApps are served by
    warm_exec --app serverapp (TLS to the SuperLink's Runtime API with the deployment's CA, ended
    with the SuperLink); warm_server=False or the subprocess isolation keep Flower's own SuperExec."""
    import sys

    from _deploy_fakes import deploy_local_commands

    cmds = deploy_local_commands(monkeypatch, tmp_path / "warm", 2, auth=False)
    link = cmds["superlink"]
    assert link[-2:] == ["--isolation", "process"]
    port = link[link.index("--port") + 1]
    ca = link[link.index("--ssl-ca-certfile") + 1]
    assert cmds["server-exec"] == [sys.executable, "-m", "flower_vfl.deploy.warm_exec", "--app", "serverapp",
                                   "--preload-package", "flower_vfl.apps.server", "--runtime-api-address",
                                   f"127.0.0.1:{port}", "--root-certificates", ca, "--parent-pid", "1"]
    # each party's executor imports flower-vfl's ClientApp (the installed package) at its start
    assert cmds["exec0"][cmds["exec0"].index("--preload-package") + 1] == "flower_vfl.apps.client"
    for name, kw in (("off", {"warm_server": False}), ("subprocess", {"isolation": "subprocess"})):
        cmds = deploy_local_commands(monkeypatch, tmp_path / name, 2, auth=False, tls=False, **kw)
        assert "--isolation" not in cmds["superlink"] and "server-exec" not in cmds


def test_serverapp_executor_refuses_the_party_only_flags(capsys):
    from flower_vfl.deploy import warm_exec

    with pytest.raises(SystemExit) as exc:
        warm_exec.main(["--app", "serverapp", "--accountants", "eager", "--insecure",
                        "--runtime-api-address", "127.0.0.1:9"])
    assert exc.value.code == 2
    assert ("error: --accountants/--lean are for a party's executor (--app clientapp): a ServerApp's executor "
            "never imports the accountants' libraries; remove them") in capsys.readouterr().err


def test_a_preload_builds_the_blas_controller_once_for_every_forked_child():
    """After a preload the warm process holds flower_vfl.core.blas's threadpoolctl controller, so a
    forked child's first ``one_blas_thread()`` builds nothing (it scanned every loaded library:
    ~14 ms a child); the child's context still sets and restores one BLAS thread. In a fresh
    interpreter (nothing built yet)."""
    import subprocess
    import sys

    code = """
import os, sys, json
from flower_vfl.deploy import warm_exec as w
from flower_vfl.core import blas
before = len(blas._CONTROLLER)
w.preload_installed(w.AppPreloader(), "flower_vfl.apps.client")
after = len(blas._CONTROLLER)
r, wfd = os.pipe()
pid = os.fork()
if pid == 0:
    built = blas._CONTROLLER[0]
    with blas.one_blas_thread() as ctx:
        inside = [lc.num_threads for lc in ctx.libs]
    same = blas._CONTROLLER[0] is built and len(blas._CONTROLLER) == 1
    os.write(wfd, json.dumps({"same": same, "inside": inside, "libs": len(built)}).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 65536))
print(json.dumps({"before": before, "after": after, **child}))
"""
    out = subprocess.run([sys.executable, "-W", "ignore::UserWarning:google", "-c", code], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    import json
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["before"] == 0 and res["after"] == 1 and res["same"] is True
    assert res["libs"] >= 1 and res["inside"] == [1] * res["libs"]


def test_a_forked_child_of_a_bundle_without_our_fab_module_still_gets_the_fab_patches(tmp_path):
    """A forked ClientApp drops this package's modules before Flower's code runs and puts the FAB's
    folder first on sys.path; the FAB may be an older flower-vfl without deploy/installed_fab.py.
    The child's patches (fab-reuse, fab-announce) must use what the warm process imported, not
    import anything of ours again (from the bundle)."""
    import subprocess
    import sys
    bundle = tmp_path / "bundle"
    (bundle / "flower_vfl").mkdir(parents=True)
    (bundle / "flower_vfl" / "__init__.py").write_text("")                 # an app with nothing of deploy/
    code = ("import sys, warnings\n"
            "from flower_vfl.flower_patches import FlowerPatchWarning\n"
            "warnings.simplefilter('error', FlowerPatchWarning)\n"       # every patch applies
            "from flower_vfl.deploy import warm_exec\n"
            "import flwr.supernode.runtime.run_clientapp as rc\n"
            "before = rc.pull_task_input, rc.install_from_fab\n"
            f"sys.path.insert(0, {str(bundle)!r})\n"
            "warm_exec._child_after_fork({})\n"
            "assert not [m for m in sys.modules if m.startswith('flower_vfl.')]\n"
            "warm_exec._reuse_installed_fabs(warm_exec.CLIENT_RUNTIME)\n"
            "assert rc.pull_task_input is not before[0] and rc.install_from_fab is not before[1]\n"
            "print(sorted(m for m in sys.modules if m.startswith('flower_vfl')))\n")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                         text=True, cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
