"""Observers of the loopback deployment's processes: empty in the product.

Nothing of flower-vfl adds to these lists. A benchmark adds its timing from outside
(``benchmarks/timing/``: a ``sitecustomize`` that fills them in every process of the deployment
when ``$FLOWER_VFL_TIMING`` names a file); the product only calls what is here, at two points:

- :data:`NODE_START`: ``fn()``, called by ``flower-vfl-supernode`` after its patches of Flower,
  just before Flower's SuperNode entry point runs;
- :data:`FORK`: ``fn(info) -> finish or None``, called in each ClientApp / ServerApp task the warm
  executor forks, after the executor's own patches and just before Flower's code runs, with
  ``info = {"who": "party" | "serverapp", "task": id, "pid": pid, "t_fork": time.time() before
  the fork, "modules_at_fork": top-level module names imported then}``; ``finish(code)`` is called
  just before the child exits, and ``finish(code, force=True)`` when Flower's force exit ends it.
"""

from __future__ import annotations

__all__ = ["NODE_START", "FORK"]

NODE_START: list = []
FORK: list = []
