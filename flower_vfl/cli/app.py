"""The Flower app shipped inside the package, so ``flower-vfl simulate``, ``predict`` and
``deploy-local`` work from any folder with only the package installed.

A Flower app is a folder with a ``pyproject.toml`` naming the ServerApp and ClientApp and
declaring the run-config keys. The project's own ``pyproject.toml`` is that file in a checkout;
an installed package has none, so this module writes the same file, made from the schema
(:func:`flower_vfl.config.schema.run_defaults`), to a per-user folder. The components are
imported from the installed package (the commands turn Flower's runtime dependency
installation off), so the app folder holds nothing else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flower_vfl.config.schema import run_defaults

__all__ = ["app_dir", "app_pyproject"]

COMPONENTS = {"serverapp": "flower_vfl.apps.server:app", "clientapp": "flower_vfl.apps.client:app"}


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)          # a TOML basic string is a JSON string
    return repr(value)


def app_pyproject() -> str:
    """The app's ``pyproject.toml``: the components and every run-config key with its default."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        ver = version("flower-vfl")
    except PackageNotFoundError:          # pragma: no cover - run from a source tree never installed
        ver = "0.0.0"
    lines = ['[build-system]', 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', '',
             '[project]', 'name = "flower-vfl-app"', f'version = "{ver}"',
             'description = "flower-vfl: the vertical ServerApp/ClientApp of the installed package"',
             'license = "Apache-2.0"', 'dependencies = []', '',
             '[tool.flwr.app]', 'publisher = "flower-vfl"', '', '[tool.flwr.app.components]',
             *(f'{k} = "{v}"' for k, v in COMPONENTS.items()), '', '[tool.flwr.app.config]',
             *(f'{k} = {_toml(v)}' for k, v in run_defaults().items())]
    return "\n".join(lines) + "\n"


def app_dir() -> Path:
    """The app folder (``$FLOWER_VFL_APP_DIR``, else ``$XDG_CACHE_HOME/flower-vfl/app``, else
    ``~/.cache/flower-vfl/app``), its ``pyproject.toml`` written when missing or different."""
    env = os.environ.get("FLOWER_VFL_APP_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flower-vfl" / "app"
    base.mkdir(parents=True, exist_ok=True)
    text, path = app_pyproject(), base / "pyproject.toml"
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)            # whole file or none, for a concurrent command
    return base
