"""What ``flower-vfl`` checks before a job starts, and how its errors speak to a CLI user.

Every run command (``fit``, ``simulate``, ``deploy-local``) calls :func:`preflight` after its
flags are parsed and before any data is read or any Flower process starts: a setting that
cannot work (an out-dir that is a file, more parties than columns, a missing a9a file, a
private party without a budgeted evaluation, an accountant whose library is missing ...)
stops the command with one line naming the flag and the fix, instead of a traceback after
the rounds ran (and the trained model lost with it).

:func:`cli_words` rewrites the errors of the package's modules, written for a Flower
operator ("set the node-config key data-dir"), into the flags of the command the user ran
("--data-dir").
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from flower_vfl.config.schema import SCHEMA, ConfigError
from flower_vfl.core.losses import LOSSES, loss_class
from flower_vfl.core.penalties import penalty_class

__all__ = ["CLIParser", "cli_words", "preflight", "check_epsilon_args", "check_audit_args",
           "BUNDLED_COLUMNS"]

#: the columns of each bundled dataset (tests/test_cli_refusals.py checks them against the data)
BUNDLED_COLUMNS = {"breast_cancer": 30, "a9a": 123}
#: the losses that need exactly two classes (their ``label_kind`` is 'binary': core/loss_base.py)
TWO_CLASS_LOSSES = tuple(name for name, cls in LOSSES.items() if cls.label_kind == "binary")


def _supports(kind, flag: str) -> bool:
    """``flag`` of a loss or penalty class (core/loss_base.py, core/penalties.py); False for an unknown name."""
    return bool(getattr(kind, flag, False))


# ---------------------------------------------------------------------------- the parser


class CLIParser(argparse.ArgumentParser):
    """The ``flower-vfl`` parser and, through ``add_subparsers``, every sub-command's (argparse
    makes sub-parsers of the parent's class, so ``ledger``, ``report`` and any module that
    registers a sub-command get it too): no abbreviated flags (``--max-round`` is not
    ``--max-rounds``; argparse's default accepts any unique prefix)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        """argparse's message, and for a mistyped flag the closest one (``--max-round``: did you
        mean --max-rounds?)."""
        if message.startswith("unrecognized arguments: "):
            import difflib
            sub = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
            cmd = next((w for w in getattr(self, "_argv", ()) if sub is not None and w in sub.choices), None)
            flags = parser_flags(self, cmd)         # the command's own flags (the top parser's without one)
            for word in message.split(": ", 1)[1].split():
                close = difflib.get_close_matches(word, sorted(flags), n=1, cutoff=0.8) if word.startswith("--") \
                    else []
                if close and close[0] != word:
                    message += f" (did you mean {close[0]}?)"
                    break
        super().error(message)

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)      # error() names the command's own flags
        return super().parse_known_args(args, namespace)


# ---------------------------------------------------------------------------- errors in the user's words

_KEY = re.compile(r"(?<![-\w])(?:the )?(?:node-config / run-config|run-config|node-config|run config|node config) "
                  r"key '?([a-z][a-z0-9-]*)'?")
#: "set id-column to ...", as the file readers say it
_SET = re.compile(r"(?<![-\w])([Ss]et) ([a-z][a-z0-9]*(?:-[a-z0-9]+)+) to\b")


def cli_words(message: str, flags) -> str:
    """``message`` with each "the run-config key X" / "node-config key X" replaced by ``--X``
    when the command has that flag (``flags``: its option strings); other keys are left as they
    are (a SuperNode's own settings, which a CLI user does not set)."""
    def repl(m):
        flag = f"--{m.group(1)}"
        return flag if flag in flags else m.group(0)

    def set_repl(m):
        flag = f"--{m.group(2)}"
        return f"{m.group(1)} {flag} to" if flag in flags else m.group(0)
    return _SET.sub(set_repl, _KEY.sub(repl, message))


def parser_flags(parser, cmd: str | None) -> set:
    """The option strings of sub-command ``cmd`` of ``parser`` (the top parser's when None)."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    p = sub.choices.get(cmd, parser) if sub is not None and cmd else parser
    return {s for a in p._actions for s in a.option_strings}


# ---------------------------------------------------------------------------- before a job


def preflight(cfg: dict, party: dict, args, command: str) -> None:
    """Refuse, before any data is read or any Flower process starts, a setting that would fail
    later: ``cfg`` is the parsed run config (flower_vfl.config.schema.parse_run_config),
    ``party`` the ``--dp-*`` flags given, ``command`` 'fit', 'simulate' or 'deploy-local'."""
    own = bool(getattr(args, "party", None))
    if not own:
        _check_bundled(cfg)
    if cfg["label-epsilon"] > 0 and not _supports(loss_class(cfg["loss"]), "supports_label_dp"):
        raise ConfigError(f"--label-epsilon {cfg['label-epsilon']:g} needs --loss logistic (randomized response on "
                          f"binary labels, with a corrected logistic loss); got --loss {cfg['loss']}: drop "
                          "--label-epsilon or use --loss logistic")
    if cfg["dp"]:
        _check_private(cfg, party)
    _check_outputs(cfg, args, own, command)        # last: a refused setting leaves no folder behind


def _check_outputs(cfg: dict, args, own: bool, command: str) -> None:
    """The folders the job writes exist or can be made, and take a file (a probe written and
    removed): checked before training, as the Flower path does (flower_vfl.apps.server.writable_folders)."""
    from flower_vfl.io.checkpoint import writable_folder
    if command == "deploy-local":          # its work folder; its out-dir defaults to <workdir>/out
        writable_folder(args.workdir, "workdir")
    out = cfg["out-dir"]
    if out:
        writable_folder(out, "out-dir")
        if command != "fit":               # the label owner's checkpoints (Flower runs only)
            writable_folder(cfg["state-dir"] or Path(out) / "state", "state-dir")
    elif cfg["state-dir"] and command != "fit":
        writable_folder(cfg["state-dir"], "state-dir")
    if own and cfg["model-dir"] and command != "deploy-local":
        writable_folder(cfg["model-dir"], "model-dir")


def _check_bundled(cfg: dict) -> None:
    """num-parties against the dataset's columns; a9a's files present, with two classes when the
    loss needs them."""
    name, n = cfg["dataset"], cfg["num-parties"]
    width = BUNDLED_COLUMNS[name]
    if n > width:
        raise ConfigError(f"--num-parties {n} is more parties than {name}'s {width} columns (each party needs at "
                          f"least one); give --num-parties between 1 and {width}")
    if name != "a9a":
        return
    from flower_vfl.io.data import source_files
    files = source_files("a9a", cfg["data-dir"] or None)
    missing = [p for p in files if not p.is_file()]
    if missing:
        where = f"--data-dir {cfg['data-dir']}" if cfg["data-dir"] else f"the default folder {files[0].parent}"
        raise ConfigError(f"a9a not found: {where} has no {' and no '.join(p.name for p in missing)}; give --data-dir "
                          "the folder holding a9a and a9a.t (LIBSVM files, e.g. from "
                          "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html#a9a)")
    for path in files:
        check_label_values(_libsvm_labels(path), cfg["loss"], f"a9a's file {path}")


def _libsvm_labels(path: Path) -> list:
    """The distinct labels of a LIBSVM file (each line's first token), without parsing the rest."""
    seen = set()
    with open(path, "rb") as fh:
        for line in fh:
            head = line.split(None, 1)[:1]
            if head and not head[0].startswith(b"#"):
                seen.add(head[0])
    out = []
    for tok in sorted(seen):
        try:
            out.append(float(tok))
        except ValueError:
            raise ConfigError(f"{path}: label {tok.decode(errors='replace')!r} is not a number; fix the file "
                              "(a LIBSVM line is '<label> <index>:<value> ...')") from None
    return sorted(set(out))


def check_label_values(values, loss: str, where: str) -> None:
    """The labels of ``where`` suit ``--loss``: two classes for logistic/hinge/sigmoid, at least
    two for multinomial, finite numbers for squared."""
    import numpy as np
    vals = np.unique(np.asarray(values, dtype=float))
    shown = ", ".join(f"{v:g}" for v in vals[:6]) + (", ..." if vals.size > 6 else "")
    if not np.all(np.isfinite(vals)):
        raise ConfigError(f"{where} has labels that are not finite numbers ({shown}); fix the file")
    if getattr(loss_class(loss), "label_kind", None) == "binary" and vals.size != 2:
        raise ConfigError(f"{where} has {vals.size} label value(s) ({shown}): --loss {loss} needs exactly 2 classes; "
                          "fix the file, or give --loss multinomial (more classes) or --loss squared (a number)")
    if _supports(loss_class(loss), "multiclass") and vals.size < 2:
        raise ConfigError(f"{where} has {vals.size} label value ({shown}): --loss multinomial needs at least 2 "
                          "classes; fix the file")


def _check_private(cfg: dict, party: dict) -> None:
    """The private parties' settings (the ``--dp-*`` flags, defaults otherwise) can be met."""
    get = lambda k: party.get(k, SCHEMA[k].default)  # noqa: E731
    loss_ok = _supports(loss_class(cfg["loss"]), "supports_private_parties")
    if not (_supports(penalty_class(cfg["penalty"]), "supports_private_parties") and loss_ok):
        raise ConfigError(f"--dp: a private party supports --penalty l2 with a one-output loss (logistic, squared, "
                          f"hinge, sigmoid); got --penalty {cfg['penalty']} --loss {cfg['loss']}: use --penalty l2"
                          + ("" if loss_ok else " and another --loss") + ", or drop --dp")
    if not (get("dp-lam") > 0 or cfg["lam"] > 0):
        raise ConfigError("--dp: a private party needs λ > 0 (its x-update must be strongly convex), but --dp-lam "
                          "and --lam are both 0; give --dp-lam (e.g. 3e-3) or --lam > 0")
    if get("dp-eval-rounds") < 1:
        raise ConfigError("--dp-eval-rounds 0: a private party would never release its final model, so the test "
                          "score, the saved model and any prediction could not include it; give --dp-eval-rounds 1 "
                          "(the default) or more")
    accountant = get("dp-accountant")
    from flower_vfl.privacy.accounting import available_methods
    if accountant not in available_methods():
        raise ConfigError(f"--dp-accountant {accountant} needs opacus, which is not installed: "
                          "pip install 'flower-vfl[opacus]', or use --dp-accountant exact (the default) or pld")
    if accountant == "paper":
        from flower_vfl.privacy.accounting import noise_multiplier_for
        releases = get("dp-train-rounds") + get("dp-eval-rounds")
        try:
            noise_multiplier_for(get("dp-epsilon"), get("dp-delta"), releases, "paper")
        except ValueError:
            raise ConfigError(f"--dp-accountant paper cannot spend --dp-epsilon {get('dp-epsilon'):g} over {releases} "
                              "release(s): the paper's Theorem 3 holds only for a per-round ε0 <= 1; give a smaller "
                              "--dp-epsilon, more --dp-train-rounds, or --dp-accountant exact") from None


# ---------------------------------------------------------------------------- the other sub-commands


def check_epsilon_args(args) -> None:
    """``flower-vfl epsilon``: a noise multiplier > 0, rounds >= 1, 0 < delta < 1."""
    if not (math.isfinite(args.noise_multiplier) and args.noise_multiplier > 0):
        raise ConfigError(f"--noise-multiplier {args.noise_multiplier:g}: expected a finite number > 0 (σ over the "
                          "sensitivity)")
    if args.rounds < 1:
        raise ConfigError(f"--rounds {args.rounds}: expected an integer >= 1 (the number of releases)")
    if not 0 < args.delta < 1:
        raise ConfigError(f"--delta {args.delta:g}: expected a number between 0 and 1 (e.g. 1e-5)")


def check_audit_args(args) -> None:
    """``flower-vfl audit``: parties, party, rounds and rows in range, a9a present."""
    width = BUNDLED_COLUMNS[args.dataset]
    if not 1 <= args.num_parties <= width:
        raise ConfigError(f"--num-parties {args.num_parties}: expected 1 to {width} ({args.dataset}'s columns)")
    if not 0 <= args.party < args.num_parties:
        raise ConfigError(f"--party {args.party}: expected a party between 0 and {args.num_parties - 1}")
    for flag, value, lo in (("--rounds", args.rounds, 1), ("--rows", args.rows, 0), ("--n-random", args.n_random, 0),
                            ("--n-climb", args.n_climb, 0)):
        if value < lo:
            raise ConfigError(f"{flag} {value}: expected an integer >= {lo}")
    for flag, value in (("--lam", args.lam), ("--rho", args.rho), ("--b1", args.b1), ("--clip", args.clip)):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} {value:g}: expected a finite number > 0")
    if args.dataset == "a9a":
        _check_bundled({"dataset": "a9a", "num-parties": args.num_parties, "data-dir": args.data_dir,
                        "loss": "logistic"})
