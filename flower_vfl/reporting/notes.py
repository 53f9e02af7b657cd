"""Notes a report, a page and the CLI print beside a figure (one place, no import cycle)."""

from __future__ import annotations

import math

#: what ``paper=inf`` among a party's ε means (flower_vfl.privacy.accounting: the paper's route is
#: Theorem 3 with Corollary 1, valid only for a per-round ε0 <= 1; beyond, it bounds nothing)
PAPER_INF_NOTE = ("paper=inf: the paper's route (Theorem 3 with Corollary 1) gives no bound at this noise, since it "
                  "holds only for a per-round ε0 <= 1; the other accountants' ε are the guarantee")


def paper_inf_note(totals) -> str:
    """:data:`PAPER_INF_NOTE` when a party's totals hold ``paper`` = inf (a float, or "inf" as
    report.json stores it), else ''."""
    v = (totals or {}).get("paper")
    try:
        return PAPER_INF_NOTE if v is not None and math.isinf(float(v)) else ""
    except (TypeError, ValueError):
        return ""
