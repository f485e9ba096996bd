"""Signals that end a command: raised where the command is (`terminate`), or held over a few renames that must
happen together (`deferred`).

A signal may arrive on any thread (ONNX Runtime's and OpenCV's included), yet Python runs its handler on the main
thread at the next bytecode, so blocking it on the main thread alone does not hold it: `terminate` itself checks
whether a deferred block is running and, if so, leaves the signal for the block's end.
"""

import contextlib
import signal
from typing import Any, Iterator, List

_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
received: List[int] = []  # every signal `terminate` handled (the command clears it when it starts)
_pending: List[int] = []  # those that came during a deferred block
_depth = [0]  # deferred blocks running (nested ones count)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP raised where the command is, like Ctrl-C: every `finally` and temporary-file cleanup
    runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interruption(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def terminate(signum: int, _frame: Any) -> None:
    """The handler a command installs for SIGINT, SIGTERM and SIGHUP: raise KeyboardInterrupt or Terminated, or
    note the signal inside `deferred`."""
    received.append(signum)
    if _depth[0]:
        _pending.append(signum)
        return
    raise interruption(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait until the block is done, then end the command as they would have."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if not _depth[0] and _pending:
            signum = _pending[0]
            del _pending[:]
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            raise interruption(signum)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
