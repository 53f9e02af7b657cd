"""deploy_local with nothing started: what each process's command line would be."""

from flower_vfl.deploy import local


def deploy_local_commands(monkeypatch, workdir, num_parties, run_config=None, **kw) -> dict[str, list[str]]:
    """Run :func:`flower_vfl.deploy.local.deploy_local` with every process, the SuperLink's port,
    the submission and the wait faked; returns name -> command line (each process its own
    interpreter: ``fork_nodes=False``)."""
    started: dict[str, list[str]] = {}

    class Procs:
        procs: dict = {}

        def start(self, name, cmd, env=None, cwd=None):
            started[name] = [str(c) for c in cmd]
            self.procs[name] = None
            return type("P", (), {"pid": 1})()

    monkeypatch.setattr(local, "record_superlink", lambda *a, **k: None)
    monkeypatch.setattr(local, "_wait_port", lambda *a, **k: None)
    monkeypatch.setattr(local, "submit", lambda *a, **k: "5")
    monkeypatch.setattr(local, "wait_run", lambda *a, **k: {"status": "finished:completed"})
    local.deploy_local(workdir, num_parties, run_config or {}, processes=Procs(), fork_nodes=False, **kw)
    return started
