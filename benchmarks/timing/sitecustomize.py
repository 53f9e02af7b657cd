"""Imported by Python at the start of every process that has this folder on its ``PYTHONPATH``
(``flower_vfl_timing.enable`` puts it there for a benchmark's deployment): with
``$FLOWER_VFL_TIMING`` set, the timing observers are added to ``flower_vfl.deploy.hooks``;
otherwise nothing is imported. A process must never fail for timing: any error is ignored."""

import os

if os.environ.get("FLOWER_VFL_TIMING"):
    try:
        import flower_vfl_timing
        flower_vfl_timing.install()
    except Exception:          # noqa: BLE001 - e.g. a process without flower_vfl installed
        pass
