"""What ``flower-vfl simulate`` shows and sets around Flower's simulation: the run's log with
each traceback folded to one line, Ray's start-up settings for a loaded machine, and where the
job's output goes.

Flower's simulation engine is Ray. On a loaded machine Ray's start prints pages of tracebacks
(its node timing out, a worker aborting) into the run's log; the command prints each traceback
as one line naming its exception, keeps the whole log in the job's folder, and says so.
"""

from __future__ import annotations

import re

__all__ = ["FoldTracebacks", "RAY_LOADED_MACHINE", "ray_env", "output_note", "written_note"]

#: Ray's own settings (its ``RAY_<name>`` environment variables, read by its GCS, raylet and driver at
#: start) that are short for a loaded 2-core machine: a worker registering, a health check answered and
#: a GCS reconnect each get more time. Ray's metrics (which Flower does not read) are off: its start took
#: 2.8 s less in the median of 6 pairs at load 11-18 (ray.init 7.2-16.2 s against 9.8-18.5 s, the two
#: alternated, issue 40 item 3). And the one line of Ray's driver that is a warning about GPUs (this job
#: uses none) is turned off as it says. Ray's driver still waits a fixed 30 s for its node
#: (``ray/_private/node.py``), which no setting changes: the job is then started once more
#: (flower_vfl.cli.commands.SIMULATE_ATTEMPTS).
RAY_LOADED_MACHINE = {
    "RAY_enable_metrics_collection": "0",
    "RAY_worker_register_timeout_seconds": "600",
    "RAY_health_check_timeout_ms": "30000",
    "RAY_health_check_failure_threshold": "20",
    "RAY_gcs_rpc_server_reconnect_timeout_s": "300",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


def ray_env(environ) -> dict:
    """:data:`RAY_LOADED_MACHINE`, except what ``environ`` (the user's environment) sets itself."""
    return {k: v for k, v in RAY_LOADED_MACHINE.items() if k not in environ}


#: a traceback's closing line, ``Name: message``, unindented (as ``flwr log`` prints it)
_EXC = re.compile(r"^([A-Za-z_][\w.]*): (\S.*)$")
#: the prefix Ray puts on a line of a worker's output, ``(pid=123) `` or ``(ClientAppActor pid=123) ``
_RAY_PREFIX = re.compile(r"^\([^()]*pid=\d+\)\s?")
_START = "Traceback (most recent call last):"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CHAIN = ("The above exception was the direct cause", "During handling of the above exception")


class FoldTracebacks:
    """A text stream between the run's log and the terminal: lines pass through, except that a
    Python traceback (from its ``Traceback (most recent call last):`` through its chained
    exceptions) is printed as one line, ``[traceback folded: <Type>: <message>; full log: ...]``.
    ``folded`` counts them; ``close()`` prints a traceback still open at the end."""

    def __init__(self, out, log_path):
        self.out, self.log_path = out, log_path
        self.folded, self._buf, self._tb, self._exc = 0, "", False, []

    def write(self, text: str) -> None:
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self._line(line)

    def flush(self) -> None:
        self.out.flush()

    def _line(self, line: str) -> None:
        plain = _ANSI.sub("", line)
        logged = plain.startswith(("ERROR :", "WARNING :", "INFO :", "DEBUG :"))   # Flower's own log lines
        body = _RAY_PREFIX.sub("", plain.split(":", 1)[1].lstrip() if logged else plain)   # a Ray worker's
        if _START in body:
            self._tb = True
            return
        if self._tb and not logged:
            stripped = body.strip()
            if not stripped or body.startswith((" ", "\t")) or stripped.startswith(_CHAIN):
                return
            m = _EXC.match(body)
            if m:
                self._exc.append(f"{m.group(1)}: {m.group(2)}")
                return
        self._emit()
        self.out.write(line + "\n")

    def _emit(self) -> None:
        if self._tb:
            self.folded += 1
            exc = self._exc[0] if self._exc else "no exception line"
            more = f" (then {self._exc[-1]})" if len(self._exc) > 1 and self._exc[-1] != self._exc[0] else ""
            self.out.write(f"[traceback folded: {exc[:300]}{more[:200]}; full log: {self.log_path}]\n")
        self._tb, self._exc = False, []

    def close(self) -> None:
        if self._buf:
            self._line(self._buf)
            self._buf = ""
        self._emit()
        self.out.flush()


def output_note(out_dir: str, model_dir: str = "") -> str:
    """The line ``simulate`` prints first: where this job's output goes (an own-data run's trained model
    goes to its ``--model-dir``)."""
    model = (f"; the trained model in {model_dir} (label-owner.npz, party-<m>.npz: flower-vfl predict "
             f"--model-dir {model_dir})") if model_dir else ""
    if out_dir:
        return (f"output: {out_dir} (report.json and metrics.csv every round; run.png and report.html at the end; "
                f"the label owner's checkpoints in {out_dir}/state){model}")
    if model_dir:
        return (f"output: the trained model in {model_dir} (label-owner.npz, party-<m>.npz) and this terminal; "
                "no report files. Give --out-dir DIR for report.json, metrics.csv, run.png and report.html")
    return ("output: this terminal only (the rounds and the final test metrics below); no files are written. Give "
            "--out-dir DIR for report.json, metrics.csv, run.png and report.html")


#: the files a finished run leaves in its out-dir (flower_vfl.apps.server.write_outputs)
REPORT_FILES = ("report.json", "metrics.csv", "run.png", "report.html", "decision_test.npy")


def written_note(out_dir: str, model_dir: str = "") -> str:
    """``wrote <out-dir>/: <the report files there>`` (and ``<model-dir>/: <the model files>``) after a
    completed run, or '' when it wrote neither."""
    from pathlib import Path
    lines = []
    if out_dir:
        there = [name for name in REPORT_FILES if (Path(out_dir) / name).is_file()]
        lines.append(f"wrote {out_dir}/: " + (", ".join(there) if there else "nothing (see the log above)"))
    if model_dir:
        files = sorted(p.name for p in Path(model_dir).glob("*.npz")) if Path(model_dir).is_dir() else []
        lines.append(f"wrote {model_dir}/: " + (", ".join(files) if files else "nothing (see the log above)"))
    return "\n".join(lines)
