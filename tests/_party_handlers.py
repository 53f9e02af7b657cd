"""Shared set-up of the tests that drive a vertical party's real ClientApp handlers on breast
cancer (party 1 of 2): its row count, the run config, δ, and Flower's task identity (the handlers
read it when they build replies); a fresh Context per run, a message to a handler, and a pinned
pair of secure-aggregation parties (the attack tests)."""

import pytest

from flower_vfl.io.data import party_block

N = party_block("breast_cancer", 1, 2)[0].shape[0]
RC = {"dataset": "breast_cancer", "num-parties": 2, "lam": 1e-2}
DELTA = 1e-5


@pytest.fixture(autouse=True)
def _task_identity():
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0


def fresh_context(node_config, run_id, run_config):
    """A fresh Context, as a SuperNode keeps one per run."""
    from flwr.app import Context, RecordDict
    return Context(run_id=run_id, node_id=7, node_config=dict(node_config), state=RecordDict(),
                   run_config=dict(run_config))


def send_message(handler, context, rd, kind):
    """``handler``'s reply to a message of type ``kind`` carrying ``rd``, as Flower delivers it."""
    from flwr.app import Message
    return handler(Message(rd, dst_node_id=7, message_type=kind), context)


def pinned_pair(tmp_path, private_eps=2.0):
    """Private party 0 and non-private party 1 (``secagg-only``), pinned keys, their own state folders."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from flower_vfl.secagg import public_key_hex, signing_key_pem
    keys = [Ed25519PrivateKey.generate() for _ in range(2)]
    nodes = {}
    for i in range(2):
        (tmp_path / f"k{i}.pem").write_bytes(signing_key_pem(keys[i]))
        nodes[i] = {"partition-id": i, "state-dir": str(tmp_path / f"s{i}"),
                    "secagg-signing-key": str(tmp_path / f"k{i}.pem"),
                    "secagg-pins": f"party{1 - i}={public_key_hex(keys[1 - i])}"}
    nodes[0].update({"dp": True, "dp-epsilon": private_eps, "dp-train-rounds": 2, "dp-eval-rounds": 1})
    nodes[1]["secagg-only"] = True
    return nodes
