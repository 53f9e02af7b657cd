"""Shared test set-up."""

import pytest


@pytest.fixture(autouse=True)
def _party_state_dir(tmp_path, monkeypatch):
    """Each test's private parties keep their ledger in their own fresh folder (the default,
    ~/.flower-vfl/party-state, is shared by every run on a machine, as a budget should be)."""
    monkeypatch.setenv("FLOWER_VFL_STATE_DIR", str(tmp_path / "party-state"))
