"""A Grid that delivers messages to ClientApp handlers in this process.

Runs the real strategy and party code without Flower's runtime (no Ray, no SuperLink):
for tests, notebooks and benchmarks. Each node keeps its own ``Context`` (node config,
persistent ``state``) exactly as a SuperNode would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["LocalGrid"]


class LocalGrid(Grid):
    """``handlers`` maps a message type ('train', 'evaluate', 'query.identify') to
    ``fn(msg, context) -> Message``; ``node_configs`` maps node id -> node config."""

    def __init__(self, handlers: dict[str, Callable], node_configs: dict[int, dict], run_config=None,
                 on_reply: Callable | None = None, run_id: int = 1):
        self.handlers = handlers
        self.contexts = {nid: Context(run_id=run_id, node_id=nid, node_config=dict(cfg), state=RecordDict(),
                                      run_config=dict(run_config or {}))
                         for nid, cfg in node_configs.items()}
        self.on_reply = on_reply
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0

    def set_run(self, run):  # pragma: no cover - not needed in process
        pass

    @property
    def run(self):  # pragma: no cover
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages):  # pragma: no cover
        raise NotImplementedError("LocalGrid delivers synchronously; use send_and_receive")

    def pull_messages(self, message_ids):  # pragma: no cover
        raise NotImplementedError

    def send_and_receive(self, messages: Iterable[Message], *, timeout=None) -> Iterable[Message]:
        replies = []
        for msg in messages:
            nid = msg.metadata.dst_node_id
            msg.metadata.__dict__["_message_id"] = msg.object_id   # as Flower's push does
            TaskIdentity.node_id = nid
            try:
                reply = self.handlers[msg.metadata.message_type](msg, self.contexts[nid])
            except Exception as exc:   # as Flower does: the ServerApp receives an error reply
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
            finally:
                TaskIdentity.node_id = 0
            if self.on_reply is not None:
                self.on_reply(msg, reply)
            replies.append(reply)
        return replies
