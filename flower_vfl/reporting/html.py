"""One self-contained HTML page per run, and several runs overlaid in one page.

``report.html`` is written next to ``report.json`` by every run that writes ``run.png``
(:func:`flower_vfl.reporting.report.write_report`): the run's curves (inline SVG, one polyline
per run and series on shared axes, the panels of :func:`flower_vfl.reporting.plots.panels_with_data`),
each party's protection and its ledger, and the settings the report recorded. No script, no
font, no image file, no link: the page opens offline and can be mailed as one file. Every ε on
the page is either a party's own total from its report or recomputed from its ledger entries by
the ledger's accountant (:func:`flower_vfl.reporting.plots.privacy_curves`); none is a constant.

    flower-vfl report runs/a                      # runs/a/report.html
    flower-vfl report runs/a runs/b -o a_vs_b.html
"""

from __future__ import annotations

import datetime
import html
import json
import math
from pathlib import Path

from flower_vfl.errors import UserError
from flower_vfl.reporting.plots import PANELS, run_label, run_series, panels_with_data, privacy_curves

__all__ = ["RunFolderError", "load_run", "render_html", "write_html"]

#: matplotlib's tab10, so a run has the colour it has in run.png / the overlay PNG
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")
#: a second column in a panel (train_loss, dual_residual) and a second private party: dashed
DASHES = ("", "7 4", "2 3", "9 3 2 3")
FIX = ("give the folder a run wrote: the --out-dir of `flower-vfl fit` or `flower-vfl simulate`, "
       "or <workdir>/out of `flower-vfl deploy-local`")


class RunFolderError(UserError, ValueError):
    """A RUN_DIR that is not a run's folder (missing, without report.json, unreadable)."""


def load_run(path) -> tuple[Path, dict, dict, str]:
    """``(run_dir, columns, report, label)`` of a run folder (or of its ``report.json``); the
    per-round columns come from the report's ``rounds`` (the rows of ``metrics.csv``)."""
    p = Path(path)
    if p.is_file() and p.name == "report.json":
        p = p.parent
    if not p.exists():
        raise RunFolderError(f"RUN_DIR {p} does not exist; {FIX}")
    rep_path = p / "report.json"
    if not rep_path.is_file():
        raise RunFolderError(f"RUN_DIR {p} has no report.json; {FIX}")
    try:
        report = json.loads(rep_path.read_text())
    except (OSError, ValueError) as exc:
        raise RunFolderError(f"{rep_path} is not a readable JSON report ({exc}); {FIX}") from None
    if not isinstance(report, dict) or not isinstance(report.get("rounds", []), list):
        raise RunFolderError(f"{rep_path} is not a flower-vfl report (no 'rounds' list); {FIX}")
    rows = [r for r in report.get("rounds") or [] if isinstance(r, dict)]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cols = {k: [_num(r.get(k)) for r in rows] for k in keys}
    return p, cols, report, run_label(p, report)


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _e(v) -> str:
    return html.escape(str(v), quote=True)


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return "—" if v is None else str(v)


# ----------------------------------------------------------------------------- charts (inline SVG)

W, H, ML, MR, MT, MB = 560, 320, 66, 16, 12, 44


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _chart(title: str, lines: list[dict], logy: bool, ylabel: str, floor0: bool = False) -> str:
    """One panel: ``lines`` each ``{run, label, key, pts, color, dash, step}``."""
    xs = [x for ln in lines for x, _ in ln["pts"]]
    ys = [y for ln in lines for _, y in ln["pts"]]
    note = ""
    if not logy and not floor0 and title != "test accuracy":       # as run.png: an early spike flattens the rest
        finals = [ln["pts"][-1][1] for ln in lines]
        if finals and max(finals) > 0 and max(ys) > 3 * max(finals):
            note = f" (axis cut at 3x the final value; peak {max(ys):.3g})"
            ys = [y for y in ys if y <= 3 * max(finals)] + [3 * max(finals)]
    if not logy and not floor0 and min(ys) > 0 and max(ys) > 100 * min(ys):   # runs of other scales: not flat lines
        logy, note = True, note + " (log scale: the values span more than two decades)"
    f = (lambda v: math.log10(v)) if logy else (lambda v: v)
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    x1 += (x1 - x0) * 0.02                               # a last release's step stays off the frame
    y0, y1 = min(map(f, ys)), max(map(f, ys))
    if floor0:
        y0 = min(0.0, y0)
    pad = (y1 - y0) * 0.06 or (abs(y1) * 0.1 or 1.0)
    y0, y1 = (y0 if floor0 else y0 - pad), y1 + pad
    pw, ph = W - ML - MR, H - MT - MB

    def px(x):
        return ML + (x - x0) / (x1 - x0) * pw

    def py(v):
        return MT + (1 - (f(v) - y0) / (y1 - y0)) * ph

    out = [f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
           f'aria-label="{_e(title)}">',
           f'<defs><clipPath id="clip-{_e(_slug(title))}"><rect x="{ML}" y="{MT}" width="{pw}" height="{ph}"/>'
           '</clipPath></defs>',
           f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    for t in _nice_ticks(x0, x1, 6):
        if x0 <= t <= x1:
            out.append(f'<line x1="{px(t):.1f}" y1="{MT}" x2="{px(t):.1f}" y2="{MT + ph}" stroke="#eee"/>'
                       f'<text x="{px(t):.1f}" y="{MT + ph + 16}" text-anchor="middle" class="tick">{t:g}</text>')
    yt = [10.0 ** k for k in range(math.ceil(y0), math.floor(y1) + 1)] if logy else []
    if len(yt) < 2:
        lo, hi = (10 ** y0, 10 ** y1) if logy else (y0, y1)
        yt = [t for t in _nice_ticks(lo, hi, 5) if t > 0 or not logy]
    for t in yt:
        if y0 <= f(t) <= y1:
            out.append(f'<line x1="{ML}" y1="{py(t):.1f}" x2="{ML + pw}" y2="{py(t):.1f}" stroke="#eee"/>'
                       f'<text x="{ML - 6}" y="{py(t) + 4:.1f}" text-anchor="end" class="tick">{t:.3g}</text>')
    out.append(f'<text x="{ML + pw / 2}" y="{H - 8}" text-anchor="middle" class="axis">round (ADMM) / epoch (SGD)'
               '</text>')
    out.append(f'<text transform="translate(14 {MT + ph / 2}) rotate(-90)" text-anchor="middle" class="axis">'
               f'{_e(ylabel)}</text>')
    out.append(f'<g clip-path="url(#clip-{_e(_slug(title))})">')
    for ln in lines:
        pts = ln["pts"]
        if ln.get("step"):                               # ε after each release: a step, held until the next
            pts = [p for i, (x, y) in enumerate(pts) for p in ([(x, pts[i - 1][1])] if i else []) + [(x, y)]]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dash = f' stroke-dasharray="{ln["dash"]}"' if ln["dash"] else ""
        out.append(f'<polyline class="curve" data-run="{ln["run"]}" data-series="{_e(ln["key"])}" fill="none" '
                   f'stroke="{ln["color"]}" stroke-width="2"{dash} points="{coords}"><title>{_e(ln["label"])}'
                   '</title></polyline>')
        if len(ln["pts"]) < 40:
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.6" fill="{ln["color"]}"/>' for x, y in ln["pts"]]
    out.append("</g></svg>")
    legend = "".join(f'<li><svg width="34" height="10"><line x1="1" y1="5" x2="33" y2="5" stroke="{ln["color"]}" '
                     f'stroke-width="2"{" stroke-dasharray=" + chr(34) + ln["dash"] + chr(34) if ln["dash"] else ""}/>'
                     f'</svg> {_e(ln["label"])}</li>' for ln in lines)
    return (f'<figure class="panel" data-panel="{_e(title)}"><figcaption>{_e(title)}{_e(note)}</figcaption>'
            + "".join(out) + f'<ul class="legend">{legend}</ul></figure>')


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def _parties(report: dict) -> list[dict]:
    """Each protected party's report: the feature parties' (``privacy``, a list in-process, a
    dict by party in Flower runs) and the label owner's (Flower runs: ``label_privacy``)."""
    priv = report.get("privacy") or []
    reps = [r for r in (priv.values() if isinstance(priv, dict) else priv) if isinstance(r, dict)]
    lab = report.get("label_privacy")
    if isinstance(lab, dict) and not any(r.get("party_id") == lab.get("party_id") for r in reps):
        reps.append(lab)
    return reps


def _curves(report: dict) -> dict:
    """privacy_curves over every protected party (the label owner of a Flower run included)."""
    try:
        return privacy_curves(dict(report, privacy=_parties(report)))
    except (ValueError, TypeError, KeyError):          # a ledger this version cannot account: said in its table
        return {}


def _panels_html(runs) -> str:
    names = panels_with_data([(d, c, dict(r, privacy=[]), lab) for d, c, r, lab in runs])   # metric panels
    if any(_curves(r) for _, _, r, _ in runs):          # the label owner of a Flower run included
        names.append("privacy")
    figs = []
    for title, keys, logy in PANELS:
        if title not in names:
            continue
        lines = []
        for i, (_, cols, report, label) in enumerate(runs):
            series = run_series(cols, report.get("final"))
            for j, key in enumerate(keys):
                if len(series.get(key, ())) > 1:
                    lines.append({"run": i, "key": key, "pts": series[key], "color": COLORS[i % 10],
                                  "dash": DASHES[j % 4], "label": label + ("" if len(keys) == 1 else f" {key}")})
        figs.append(_chart(title, lines, logy, " / ".join(keys)))
    if "privacy" in names:
        lines = []
        for i, (_, _, report, label) in enumerate(runs):
            for j, (who, (rounds, eps)) in enumerate(_curves(report).items()):
                lines.append({"run": i, "key": f"epsilon {who}", "pts": list(zip(rounds, eps)), "step": True,
                              "color": COLORS[i % 10], "dash": DASHES[j % 4], "label": f"{label} {who}"})
        figs.append(_chart("ε spent (each private party's ledger)", lines, False, "ε", floor0=True))
    if not figs:
        return '<p class="empty">No per-round series: every value of these runs is in the table above.</p>'
    return "".join(figs)


# ----------------------------------------------------------------------------- tables

def _spent(rep: dict) -> str:
    from flower_vfl.reporting.notes import paper_inf_note
    tot = rep.get("totals") or {}
    note = paper_inf_note(tot)
    return ", ".join(f"{k}={_fmt(v)}" for k, v in tot.items() if k != "delta") + (f" ({note})" if note else "")


def _runs_table(runs) -> str:
    head = ("", "run", "engine", "rounds", "converged", "objective", "train loss", "test loss", "test accuracy",
            "wall time (s)", "protected parties: ε spent")
    rows = []
    for i, (path, cols, report, label) in enumerate(runs):
        fin = report.get("final") or {}
        n = fin.get("rounds", fin.get("round", len(cols.get("round", []))))
        prot = "; ".join(f"{p.get('party_id', '?')}: {_spent(p)}" for p in _parties(report)) or "none"
        cells = [f'<span class="swatch" style="background:{COLORS[i % 10]}"></span>',
                 f'{_e(label)}<div class="path">{_e(Path(path).resolve())}</div>', _e(report.get("engine", "?")), _e(_fmt(n)),
                 _e(_fmt(fin.get("converged"))), *(_e(_fmt(fin.get(k))) for k in
                                                   ("objective", "train_loss", "test_loss", "test_accuracy")),
                 _e(_fmt(fin.get("wall_time_s"))), _e(prot)]
        rows.append(f'<tr class="run-row" data-run="{i}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    warn = "".join(f'<p class="warning"><b>{_e(label)}:</b> {_e(report["final"]["dp_warning"])}</p>'
                   for _, _, report, label in runs if (report.get("final") or {}).get("dp_warning"))
    return (f'<table id="runs"><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>{warn}')


def _ledger_table(rep: dict, report: dict) -> str:
    entries = [e for e in (rep.get("ledger") or {}).get("entries") or [] if isinstance(e, dict)]
    if not entries:
        return '<p class="empty">No release in the ledger.</p>'
    who = str(rep.get("party_id", "?"))
    if all("flip_probability" in e for e in entries):   # the label owner's randomized response
        from flower_vfl.privacy.label_dp import label_epsilon_spent
        delta = float((rep.get("totals") or {}).get("delta") or 0.0)
        head = ("#", "release", "mechanism", "labels", "flip probability", f"ε (PLD accountant, δ={delta:g})")
        body = []
        for k, e in enumerate(entries, 1):
            p = float(e["flip_probability"])
            eps = label_epsilon_spent(math.log((1 - p) / p), delta)
            body.append((k, e.get("release"), e.get("mechanism"), e.get("labels"), p, eps))
    else:
        try:
            curve = privacy_curves({"privacy": [rep], "rounds": report.get("rounds") or []})
            (_, (_, eps)), = curve.items()
            eps, err = eps[1:], ""
        except (ValueError, TypeError, KeyError) as exc:
            eps, err = [None] * len(entries), f"ε not accounted: {type(exc).__name__}: {exc}"
        led, cfg = rep.get("ledger") or {}, rep.get("config") or {}
        method, delta = led.get("method", cfg.get("accountant", "exact")), led.get("delta", cfg.get("delta"))
        head = ("#", "round", "kind", "σ", "sensitivity", "noise multiplier z",
                f"ε spent after it ({method} accountant, δ={_fmt(delta)})")
        body = [(k, e.get("round"), e.get("kind"), e.get("sigma"), e.get("sensitivity"), e.get("noise_multiplier"),
                 x if x is not None else "not accountable") for k, (e, x) in enumerate(zip(entries, eps), 1)]
        if err:
            return f'<p class="warning">{_e(err)}</p>'
    rows = "".join(f'<tr class="ledger-row" data-party="{_e(who)}">' + "".join(f"<td>{_e(_fmt(c))}</td>" for c in r)
                   + "</tr>" for r in body)
    more = (rep.get("ledger") or {}).get("releases_all_runs")
    note = (f'<caption>{len(entries)} release(s) in this run'
            + (f"; {more} in this party's ledger over all runs" if more is not None else "") + "</caption>")
    return (f'<table class="ledger" data-party="{_e(who)}">{note}<thead><tr>'
            + "".join(f"<th>{_e(h)}</th>" for h in head) + f"</tr></thead><tbody>{rows}</tbody></table>")


def _protection(runs) -> str:
    out = []
    for i, (_, _, report, label) in enumerate(runs):
        parties = _parties(report)
        out.append(f'<div class="run-privacy" data-run="{i}"><h3><span class="swatch" '
                   f'style="background:{COLORS[i % 10]}"></span>{_e(label)}</h3>')
        lab = report.get("label_privacy")
        if isinstance(lab, str):
            out.append(f'<p class="note">labels: {_e(lab)}</p>')
        if not parties:
            out.append('<p class="note">No party used differential privacy in this run: the values the parties '
                       "exchanged were exact.</p>")
        prot = (report.get("final") or {}).get("protection")
        if isinstance(prot, dict) and prot:
            keys = list(dict.fromkeys(k for v in prot.values() if isinstance(v, dict) for k in v))
            out.append('<table class="coverage"><caption>what each party\'s data is protected by</caption><thead><tr>'
                       "<th>party</th>" + "".join(f"<th>{_e(k.replace('_', ' '))}</th>" for k in keys)
                       + "</tr></thead><tbody>"
                       + "".join(f'<tr><td>{_e(p)}</td>' + "".join(f"<td>{_e(_fmt((v or {}).get(k)))}</td>" for k in keys)
                                 + "</tr>" for p, v in prot.items() if isinstance(v, dict)) + "</tbody></table>")
        for rep in parties:
            who = rep.get("party_id", "?")
            cfg = rep.get("config") or {}
            facts = [("mechanism", rep.get("mechanism") or f"Gaussian, calibration={cfg.get('calibration', '?')}, "
                                                            f"noise form={cfg.get('noise_form', '?')}"),
                     ("budget", ", ".join(f"{k}={_fmt(cfg[k])}" for k in ("epsilon", "delta", "label_epsilon")
                                          if k in cfg) or "—"),
                     ("ε spent (its own accountants)", _spent(rep) or "—"),
                     ("noise multiplier z", rep.get("noise_multiplier")),
                     ("neighbouring relation", rep.get("neighbouring_relation")),
                     ("protects", rep.get("protects")), ("does not protect", rep.get("does_not_protect")),
                     ("settings", ", ".join(f"{k}={_fmt(v)}" for k, v in cfg.items()))]
            out.append(f'<div class="party" data-party="{_e(who)}"><h4>{_e(_who(who))}</h4><table class="facts">'
                       + "".join(f"<tr><th>{_e(k)}</th><td>{_e(_fmt(v))}</td></tr>" for k, v in facts
                                 if v not in (None, "")) + "</table>")
            n = len((rep.get("ledger") or {}).get("entries") or [])
            out.append(f'<details{" open" if n <= 25 else ""}><summary>ledger ({n} release(s))</summary>'
                       f"{_ledger_table(rep, report)}</details></div>")
        out.append("</div>")
    return "".join(out)


def _who(party_id) -> str:
    return f"party {party_id}" if isinstance(party_id, int) or str(party_id).isdigit() else str(party_id)


def _settings(runs) -> str:
    cfgs = [r.get("config") if isinstance(r.get("config"), dict) else {} for _, _, r, _ in runs]
    keys = list(dict.fromkeys(k for c in cfgs for k in c))
    if not keys:
        return '<p class="empty">The report records no settings.</p>'
    head = "<th>key</th>" + "".join(f'<th><span class="swatch" style="background:{COLORS[i % 10]}"></span>{_e(lab)}</th>'
                                    for i, (_, _, _, lab) in enumerate(runs))
    rows = []
    for k in keys:
        vals = [_fmt(c[k]) if k in c else "(default)" for c in cfgs]
        differs = len(runs) > 1 and len(set(vals)) > 1
        rows.append(f'<tr class="setting{" differs" if differs else ""}" data-key="{_e(k)}"><td>{_e(k)}</td>'
                    + "".join(f"<td>{_e(v)}</td>" for v in vals) + "</tr>")
    return (f'<table id="settings-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            '<p class="note">The run-config keys recorded in report.json; "(default)": the run did not set the key, '
            "which took its default (flower_vfl/config/schema.py)" + ("; highlighted rows differ between runs" if len(runs) > 1 else "")
            + ". Each private party's own settings are under Protection.</p>")


def _party_models(runs) -> str:
    """Each party's block model (kind and settings), as the party told the central node at identify
    (report.json ``party_models``; docs/party-models.md)."""
    models = [r.get("party_models") if isinstance(r.get("party_models"), dict) else {} for _, _, r, _ in runs]
    parties = sorted({str(p) for m in models for p in m}, key=lambda p: (not p.isdigit(), int(p) if p.isdigit() else 0, p))
    if not parties:
        return ""
    head = "<th>party</th>" + "".join(f'<th><span class="swatch" style="background:{COLORS[i % 10]}"></span>{_e(lab)}</th>'
                                      for i, (_, _, _, lab) in enumerate(runs))
    rows = "".join(f'<tr class="party-model" data-party="{_e(p)}"><td>{_e(_who(p))}</td>'
                   + "".join(f"<td>{_e(m.get(p, '(not reported)'))}</td>" for m in models) + "</tr>"
                   for p in parties)
    return ('<h3>Party block models</h3><table id="party-models-table"><thead><tr>' + head + "</tr></thead><tbody>"
            + rows + '</tbody></table><p class="note">Each party\'s block model, kind and settings, as the party '
            "said at identify (its own node config chooses it; docs/party-models.md).</p>")


CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:24px;color:#222;
max-width:1260px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}h4{font-size:14px;margin:12px 0 4px}
.sub,.path,.note{color:#666;font-size:12px}.path{word-break:break-all}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;
vertical-align:top}th{background:#f4f4f4}caption{text-align:left;color:#666;font-size:12px;padding:2px 0}
table.facts th{width:210px;font-weight:normal;color:#444}
tr.differs td{background:#fff6d5}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px;vertical-align:-1px}
.panels{display:flex;flex-wrap:wrap;gap:14px}
figure.panel{margin:0;border:1px solid #e4e4e4;padding:6px}
figcaption{font-weight:600;margin-bottom:2px}
svg.chart text{font:11px sans-serif;fill:#444}svg.chart text.axis{font-size:12px;fill:#222}
ul.legend{list-style:none;margin:4px 0 0;padding:0;font-size:12px;max-width:560px}
ul.legend svg{vertical-align:middle}
.warning{background:#fdecea;border-left:4px solid #d62728;padding:6px 10px}
.empty{color:#666;font-style:italic}
"""


def render_html(runs, title: str | None = None) -> str:
    """The page of ``runs`` (``load_run`` tuples): one run's report, or several overlaid."""
    runs = list(runs)
    title = title or (f"flower-vfl run {runs[0][3]}" if len(runs) == 1 else f"flower-vfl: {len(runs)} runs")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><p class=\"sub\">written {when} from "
            + ", ".join(_e(Path(p).resolve() / "report.json") for p, _, _, _ in runs) + "</p>"
            f'<section id="summary"><h2>Runs</h2>{_runs_table(runs)}</section>'
            f'<section id="curves"><h2>Curves</h2><div class="panels">{_panels_html(runs)}</div></section>'
            f'<section id="privacy"><h2>Protection and ledgers</h2>{_protection(runs)}</section>'
            f'<section id="settings"><h2>Settings</h2>{_settings(runs)}{_party_models(runs)}</section>'
            "</body></html>\n")


def write_html(run_dirs, out=None, title: str | None = None) -> Path:
    """``report.html`` of one run (default ``RUN_DIR/report.html``) or the overlay of several
    (``out`` required), written atomically; every RUN_DIR is checked before anything is written."""
    from flower_vfl.io.checkpoint import atomic_write
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise RunFolderError(f"no RUN_DIR given; {FIX}")
    if out is None:
        if len(runs) > 1:
            raise ValueError("several runs: give out, the page's path")
        out = runs[0][0] / "report.html"
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_html(runs, title).encode()
    atomic_write(path, lambda fh: fh.write(text))
    return path
