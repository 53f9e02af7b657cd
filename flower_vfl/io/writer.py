"""Durable writes off the critical path of a round (no Flower imports).

The label owner rewrites its checkpoint and its report after every round (atomic files, each
fsynced: :mod:`flower_vfl.io.checkpoint`). Done in line, that is 30-60 ms between a round's
replies and the next round's messages on a9a, enough to push a Flower simulation round into a
second 0.1 s polling tick. A :class:`RoundWriter` runs those writes in one worker thread while
the parties compute the next round, with the rules that keep them as safe as in line:

- the caller hands it **snapshots** (copies), never live state, so the next round cannot change
  what is being written;
- the writes of one round run **in order** (the checkpoint of round k before its report), and
  once one fails the later ones are skipped, so the report never claims a round whose
  checkpoint failed;
- **at most one round in flight**: :meth:`RoundWriter.wait` (called before a round's writes
  are handed over, and before the run ends or fails) waits for the previous ones and raises
  their first error there (a full disk stops the run one round later than in line, with the
  same :class:`~flower_vfl.io.checkpoint.DiskError`; the previous files stay whole).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["RoundWriter"]


class RoundWriter:
    """One worker thread for a run's per-round files; ``inline=True`` writes in the caller."""

    def __init__(self, inline: bool = False):
        self.inline = bool(inline)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._error: BaseException | None = None

    def submit(self, write) -> None:
        """Run ``write()`` after the writes submitted before it (skipped once one of them failed)."""
        if self.inline:
            write()
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flower-vfl-writer")
        self._pending.append(self._pool.submit(self._run, write))

    def _run(self, write) -> None:
        if self._error is not None:      # an earlier write of this batch failed: keep its files as they are
            return
        try:
            write()
        except BaseException as exc:     # raised to the caller at the next wait()
            self._error = exc

    def wait(self) -> None:
        """Wait for every write submitted so far; raise the first one's error (once)."""
        for fut in self._pending:
            fut.result()
        self._pending.clear()
        err, self._error = self._error, None
        if err is not None:
            raise err

    def close(self, raising: bool = True) -> BaseException | None:
        """Wait for the pending writes and stop the thread. ``raising=False`` (a run already
        failing with another error): a write's error is returned instead of raised."""
        try:
            self.wait()
        except BaseException as exc:
            if raising:
                raise
            return exc
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
        return None
