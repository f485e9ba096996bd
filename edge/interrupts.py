"""Who answers SIGINT, SIGTERM and SIGHUP, phase by phase: `PHASES` is the one table, `Phase` the one installer
(no other module sets a signal handler; tests/test_interrupts.py checks).

    with Phase("command"):                    # the table's handlers from here on (main thread only) ...
        ...                                   # ... and the ones it replaced are back afterwards

Python runs a handler on the main thread at its next bytecode, whichever thread the signal came to, so a phase
entered on the main thread holds for every thread; entered on another thread it changes nothing.
"""

import signal
import threading
from types import TracebackType
from typing import Any, Callable, Dict, List, Optional, Type

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

RAISE = "raise"  # end the command where it is: KeyboardInterrupt (SIGINT) or Terminated; every `finally` runs
IGNORE = "ignore"  # dropped
STOP = "stop"  # the phase's owner stops at its next safe point (its `stop` action)
RELOAD = "reload"  # the phase's owner reloads at its next safe point (its `reload` action)
HOLD = "hold"  # held back until the phase ends (noted in `Phase.held`), then its owner answers it, in words

PHASES: Dict[str, Dict[int, str]] = {
    # every command's body (edge.cli.common.execute)
    "command": {signal.SIGINT: RAISE, signal.SIGTERM: RAISE, signal.SIGHUP: RAISE},
    # the body of a command that serves SIGHUP as a reload (`edge run`), until it is serving: never fatal
    "reloading_command": {signal.SIGINT: RAISE, signal.SIGTERM: RAISE, signal.SIGHUP: IGNORE},
    # the frame loop (edge.service.signals.StopFlag): the frame in hand is finished, then the report; a reload
    # swaps models between two frames
    "serving": {signal.SIGINT: STOP, signal.SIGTERM: STOP, signal.SIGHUP: RELOAD},
    # a build chain from its first install step through its cleanup (edge.model.steps.run_steps): an install is
    # finished, never cut in half, and the chain says the signal came
    "installing": {signal.SIGINT: HOLD, signal.SIGTERM: HOLD, signal.SIGHUP: HOLD},
}
_OWNER_ACTIONS = (STOP, RELOAD)  # actions the phase's owner supplies

received: List[int] = []  # every signal a RAISE handler took (the command clears it when it starts)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP raised where the command is, like Ctrl-C: every `finally` and temporary-file cleanup
    runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interruption(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _terminate(signum: int, _frame: Any) -> None:
    received.append(signum)
    raise interruption(signum)


class Phase:
    """`PHASES[name]`'s handlers, installed by `begin()` (or `with`; again is a no-op) and the replaced ones put
    back by `end()`. `actions` are the owner's STOP / RELOAD callables (`action(signum)`), exactly those its row
    names. A SIGINT this process was started to ignore (a background job's) stays ignored in every phase."""

    def __init__(self, name: str, **actions: Callable[[int], None]) -> None:
        wanted = {a for a in PHASES[name].values() if a in _OWNER_ACTIONS}
        if set(actions) != wanted:
            raise TypeError("phase {!r} needs the actions {}, got {}".format(name, sorted(wanted), sorted(actions)))
        self.name = name
        self.held: List[int] = []  # HOLD: the signals that came, in order
        self._actions = actions
        self._replaced: Optional[Dict[int, Any]] = None

    def _handler(self, sig: int) -> Any:
        if sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
            return signal.SIG_IGN
        action = PHASES[self.name][sig]
        if action == RAISE:
            return _terminate
        if action == IGNORE:
            return signal.SIG_IGN
        if action == HOLD:
            return lambda signum, _frame: self.held.append(signum)
        owner = self._actions[action]
        return lambda signum, _frame: owner(signum)

    def begin(self) -> "Phase":
        if self._replaced is None and threading.current_thread() is threading.main_thread():
            self._replaced = {sig: signal.signal(sig, self._handler(sig)) for sig in SIGNALS}
        return self

    def end(self) -> None:
        for sig, previous in (self._replaced or {}).items():
            signal.signal(sig, previous)
        self._replaced = None

    def __enter__(self) -> "Phase":
        return self.begin()

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.end()
