"""Shared set-up of the tests that drive a vertical party's real ClientApp handlers on breast
cancer (party 1 of 2): its row count, the run config, δ, and Flower's task identity (the handlers
read it when they build replies)."""

import pytest

from flower_vfl.io.data import party_block

N = party_block("breast_cancer", 1, 2)[0].shape[0]
RC = {"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-2}
DELTA = 1e-5


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0
