"""Flower apps: the ServerApp and ClientApp of vertical training (``server``, ``client``) and
the horizontal DP-IADMM pair (``horizontal``). ``pyproject.toml``'s ``[tool.flwr.app.components]``
names them."""
