"""``flower-vfl report RUN_DIR [RUN_DIR ...] [-o OUT]``: one run's HTML page, or several runs
overlaid in one page (one curve per run on shared axes, a table row per run, the settings side
by side); ``-o x.png`` draws the same curves as a PNG instead (flower_vfl/reporting/plots.py).

    flower-vfl report runs/a                       # runs/a/report.html
    flower-vfl report runs/a runs/b -o a_vs_b.html
    flower-vfl report runs/a runs/b -o a_vs_b.png
"""

from __future__ import annotations

from pathlib import Path

from flower_vfl.config.schema import ConfigError

__all__ = ["add_parser", "cmd_report"]


def add_parser(sub):
    """Register ``report`` on the ``flower-vfl`` subparsers (flower_vfl/cli/commands.py)."""
    p = sub.add_parser("report", help="one run's HTML page (curves, protection and ledgers, settings), or several "
                                      "runs overlaid in one page (-o out.html) or PNG (-o out.png)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="folders a run wrote (report.json + metrics.csv): fit/simulate --out-dir, deploy-local's "
                        "<workdir>/out")
    p.add_argument("-o", "--out", default="",
                   help="the page (.html) or picture (.png) to write; default RUN_DIR/report.html for one run, "
                        "runs.html for several; a folder: the default name inside it")
    p.set_defaults(fn=cmd_report)
    return p


def cmd_report(args):
    from flower_vfl.reporting.html import load_run, write_html
    for d in args.run_dirs:              # every folder checked before anything is written
        load_run(d)
    out = Path(args.out) if args.out else None
    several = len(args.run_dirs) > 1
    if out is not None and out.is_dir():
        out = out / ("runs.html" if several else "report.html")
    suffix = out.suffix.lower() if out is not None else ".html"
    if suffix not in (".html", ".htm", ".png"):
        raise ConfigError(f"-o {args.out}: give a path ending in .html (the page) or .png (the picture), or a folder")
    if out is not None:                  # its folder, before anything is drawn
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"-o {args.out}: its folder {out.parent} cannot be made ({exc.strerror or exc}); give a "
                              "path in a writable folder") from None
    if suffix == ".png":
        from flower_vfl.reporting.plots import plot_run, plot_runs
        path = plot_runs(args.run_dirs, out) if several else plot_run(args.run_dirs[0], out)
    else:
        path = write_html(args.run_dirs, out if out is not None else (Path("runs.html") if several else None))
    print(f"wrote {path}")
    return 0
