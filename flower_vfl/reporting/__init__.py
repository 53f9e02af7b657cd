"""Run reports (``report``: JSON-safe values, report.json / metrics.csv), plots (``plots``: run.png)
and the self-contained HTML page of one or several runs (``html``: report.html)."""
