"""Per-party memory of a loopback deployment (issue 23 item 5; docs/benchmarks.md, "Soak and scale
on loopback"): a non-private party's warm executor does not import opacus' accountants (torch,
~235 MB each); a private party's does, at start when deploy-local knows it is private, or after its
first private message; a forked ClientApp freezes what it inherits out of the cyclic GC (no
copy-on-write of the warm process's pages by a collection). Fast: no Flower deployment, no timing."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flower_vfl.deploy import local
from flower_vfl.deploy import warm_exec

ROOT = Path(__file__).resolve().parents[1]
HAS_OPACUS = importlib.util.find_spec("opacus") is not None

#: warm_exec.main up to Flower's SuperExec loop, which is replaced by a print of what was imported
MAIN_THEN_REPORT = """
import json, sys
import flwr.supercore.superexec.run_superexec as rs
def report(**kwargs):
    print("MODULES " + json.dumps({m: m in sys.modules for m in ("torch", "opacus.accountants", "dp_accounting")}))
rs.run_superexec = report
from flower_vfl.deploy.warm_exec import main
main(["--insecure", "--runtime-api-address", "127.0.0.1:9", *sys.argv[1:]])
"""


def _python(code: str, *args: str) -> str:
    env = dict(os.environ, PYTHONWARNINGS="ignore", FLWR_TELEMETRY_ENABLED="0")
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def _modules(*args: str) -> dict:
    out = _python(MAIN_THEN_REPORT, *args)
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("MODULES "))[len("MODULES "):])


@pytest.mark.parametrize("args", [(), ("--lean",)], ids=["default-auto", "lean"])
def test_a_non_private_partys_warm_executor_does_not_import_torch(args):
    mods = _modules(*args)
    assert mods["torch"] is False and mods["opacus.accountants"] is False
    assert mods["dp_accounting"] is True            # every party's messages import it: shared, ~45 MB


@pytest.mark.slow                                   # imports torch (~3 s on a quiet machine)
@pytest.mark.skipif(not HAS_OPACUS, reason="opacus (the [opacus] extra) not installed")
def test_a_private_partys_warm_executor_imports_the_accountants_at_start():
    mods = _modules("--accountants", "eager")
    assert mods["opacus.accountants"] is True and mods["torch"] is True


#: a warm process learns from a forked child's report (the pipe it writes at exit); json.tool
#: stands for opacus' accountants (cheap to import)
LEARN = """
import json, os, sys
import flower_vfl.deploy.warm_exec as w
w.WARM_PRIVATE = ("json.tool",)
learn = sys.argv[1] == "learn"
assert "json.tool" not in sys.modules
# the child's side: what it imported from WARM_PRIVATE that the warm process had not
r, wfd = os.pipe()
report = w._report_bundle_modules({}, wfd, bundles=False, learn=w.WARM_PRIVATE)
import json.tool
report()
os.close(wfd)
sent = os.read(r, 65536)
print("SENT " + sent.decode())
del sys.modules["json.tool"]
# the warm process's side
ex = w._fork_executor(None, None, learn=learn)
r2, w2 = os.pipe()
os.write(w2, sent)
os.close(w2)
ex._preload_from(r2)
print("IMPORTED " + json.dumps("json.tool" in sys.modules))
"""


@pytest.mark.parametrize("mode, imported", [("learn", True), ("off", False)])
def test_the_auto_executor_imports_what_a_private_message_imported(mode, imported):
    out = _python(LEARN, mode)
    sent = json.loads(next(ln for ln in out.splitlines() if ln.startswith("SENT "))[len("SENT "):])
    assert sent == {"warm": ["json.tool"]}
    assert json.loads(next(ln for ln in out.splitlines() if ln.startswith("IMPORTED "))[len("IMPORTED "):]) \
        is imported


def test_import_private_libraries_imports_only_the_private_list():
    assert warm_exec.import_private_libraries(["os", "json"]) == []        # not in WARM_PRIVATE: ignored


FREEZE = """
import gc, os, sys
import flower_vfl.deploy.warm_exec as w
r, wfd = os.pipe()
pid = os.fork()
if pid == 0:
    w._child_after_fork({})
    os.write(wfd, str(gc.get_freeze_count()).encode())
    os._exit(0)
os.close(wfd)
print("FROZEN_CHILD " + os.read(r, 100).decode())
os.waitpid(pid, 0)
print("FROZEN_PARENT " + str(gc.get_freeze_count()))
"""


def test_a_forked_clientapp_freezes_what_it_inherits_and_the_warm_process_does_not():
    out = dict(ln.split(" ", 1) for ln in _python(FREEZE).splitlines() if ln.startswith("FROZEN_"))
    assert int(out["FROZEN_CHILD"]) > 1000         # the inherited objects: out of the child's collections
    assert int(out["FROZEN_PARENT"]) == 0          # the warm process collects as usual


@pytest.mark.parametrize("nc, rc, private", [
    ({}, {}, False),
    ({"dp-epsilon": 1.0}, {}, True),
    ({"dp": True, "dp-epsilon": 1.0}, {}, True),
    ({"dp": False, "dp-epsilon": 1.0}, {}, False),
    ({"dp": False, "dp-epsilon": 1.0}, {"dp": True, "dp-parties": "0", "num-parties": 2}, True),
    ({}, {"dp": True, "dp-parties": "0", "num-parties": 2}, True),       # refuses to start: counted private
    ({}, {"dp": True, "dp-parties": "1", "num-parties": 2}, False),
])
def test_party_is_private_follows_the_partys_own_rule(nc, rc, private):
    assert local.party_is_private(0, rc, nc) is private


class _FakeProc:
    def __init__(self, pid):
        self.pid, self.returncode = pid, None

    def poll(self):
        return None


class _FakeProcesses(local.Processes):
    """Records each command instead of starting it."""

    def start(self, name, cmd, env=None, cwd=None):
        proc = _FakeProc(10_000_000 + len(self.procs))
        self.procs[name], self.cmds = proc, {**getattr(self, "cmds", {}), name: [str(c) for c in cmd]}
        return proc

    def stop_all(self):
        self.procs = {}


def test_deploy_local_imports_the_accountants_at_start_only_for_a_private_party(tmp_path, monkeypatch):
    class Submitted(Exception):
        pass

    def submit(*args, **kwargs):
        raise Submitted

    monkeypatch.setenv("FLOWER_VFL_RUNTIME_DIR", str(tmp_path / "registry"))
    monkeypatch.setattr(local, "_wait_port", lambda *a, **k: None)
    monkeypatch.setattr(local, "submit", submit)
    procs = _FakeProcesses(tmp_path / "logs")
    with pytest.raises(Submitted):
        local.deploy_local(tmp_path, 3, {"dataset": "breast_cancer", "num-parties": 3}, tls=False, auth=False,
                           processes=procs, node_configs={1: {"dp": True, "dp-epsilon": 2.0, "dp-delta": 1e-5}},
                           fork_nodes=False)        # each executor's own command line
    flag = {name: cmd[cmd.index("--accountants") + 1] for name, cmd in procs.cmds.items() if name.startswith("exec")}
    assert flag == {"exec0": "auto", "exec1": "eager", "exec2": "auto"}
