"""Run reports (``report``: JSON-safe values, report.json / metrics.csv) and plots (``plots``)."""
