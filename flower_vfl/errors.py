"""User-facing errors: one :class:`UserError` base, and in Flower runs one clear line, no
traceback, and still a failed run.

Every error meant for the user subclasses :class:`UserError`; anything else is a bug. A bad export, a wrong config key, a party's refusal or a missing party stops a run with a
message that names the file (or key, or party) and the fix. Flower logs every exception that
ends a ServerApp with its traceback (``"ServerApp raised an exception"`` on a SuperLink,
``"Simulation raised an exception"`` in ``flwr run``'s simulation), and a run is marked
``finished:failed`` only when the ServerApp raises. So the ServerApp still raises, and
:class:`CleanUserErrors`, a :class:`logging.Filter` on Flower's logger installed when our
ServerApp / ClientApp is imported, turns such a record into one line without the traceback.
Any other exception (a bug) keeps its traceback.

On a party, :func:`reply_user_errors` wraps a ClientApp handler: a user-facing error becomes
an error *reply* (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``, reason ``"<Type>: <message>"``)
that the server turns into its own clear error, instead of an exception that Flower (and
Ray, in the simulation) would log with two tracebacks. A bug in a handler still raises.
"""

from __future__ import annotations

import functools
import logging

__all__ = ["UserError", "PartyMissing", "is_user_error", "CleanUserErrors", "install_log_filter",
           "reply_user_errors"]


class UserError(Exception):
    """Base of every error whose message is meant for the user: it names the file, key or party,
    and the fix. Each subclass also keeps its builtin kind (``ConfigError(UserError, ValueError)``,
    ``Refused(UserError, RuntimeError)`` ...), so ``except ValueError`` still catches it.

    The subclasses: :class:`~flower_vfl.config.schema.ConfigError`,
    :class:`~flower_vfl.io.sources.DataError`, :class:`~flower_vfl.io.psi.AlignmentError`,
    :class:`~flower_vfl.io.model_files.ModelFileError`, :class:`~flower_vfl.privacy.boundary.Refused`
    (InvalidMessage, BudgetExceeded, ReplayRefused, PlanExceeded), the central node's reply errors
    (ReplyError, PartyFailed, PartyLost, PartyRefused, AgentRefused), the party store's
    StoreError (LedgerMissing) and :class:`PartyMissing`. This module imports nothing of the package, so any
    room may define one.
    """


class PartyMissing(UserError, RuntimeError):
    """A party whose part is needed (its scores, its model) did not provide it."""


def is_user_error(exc: BaseException | None) -> bool:
    return isinstance(exc, UserError)


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class CleanUserErrors(logging.Filter):
    """Drop the traceback of a log record whose exception is a user-facing error and put the
    error's type and message on the record's line instead (every other record unchanged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if isinstance(record.exc_info, tuple) and len(record.exc_info) > 1 else None
        if exc is not None and is_user_error(exc):
            record.msg = f"{record.getMessage()}: {one_line(exc)}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
        return True


def install_log_filter(logger_name: str = "flwr") -> CleanUserErrors:
    """Add :class:`CleanUserErrors` to Flower's logger once (idempotent); returns it."""
    logger = logging.getLogger(logger_name)
    for f in logger.filters:
        if isinstance(f, CleanUserErrors):
            return f
    f = CleanUserErrors()
    logger.addFilter(f)
    return f


def reply_user_errors(handler):
    """Wrap a ClientApp handler ``fn(msg, context) -> Message``: a user-facing error is logged
    as one line on the party's own node and answered with an error reply naming it."""

    @functools.wraps(handler)
    def wrapped(msg, context):
        try:
            return handler(msg, context)
        except Exception as exc:
            if not is_user_error(exc):
                raise                       # a bug: Flower logs it with its traceback
            from flwr.app import Error, Message
            from flwr.common.constant import ErrorCode
            from flwr.common.logger import log
            log(logging.ERROR, "%s failed (%s): %s", msg.metadata.message_type, type(exc).__name__, exc)
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=one_line(exc)), reply_to=msg)

    return wrapped
