"""Stop and reload requests for the frame loop. Imports nothing slow: `edge run` enters it before it reads the
config or loads a model, so a signal during start-up is noted, never fatal.

    with StopFlag() as stop:     # SIGINT/SIGTERM/SIGHUP handled from here on (main thread only) ...
        ...                      # ... and the handlers it replaced are back afterwards
"""

import threading
from types import TracebackType
from typing import Optional, Type

from edge.interrupts import Phase


class StopFlag:
    """The "serving" phase of edge.interrupts: SIGINT/SIGTERM (or `request(why)`) set `event`: the loop finishes
    the frame in hand, then reports. SIGHUP sets `reload`: the loop swaps to the model the config now names,
    between two frames. Without `with` nothing is installed and only `request()` stops (a command that keeps
    Python's own Ctrl-C)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reload = threading.Event()
        self.signal: Optional[int] = None
        self.reason: Optional[str] = None
        self._phase = Phase("serving", stop=self._stop, reload=lambda _signum: self.reload.set())

    def __enter__(self) -> "StopFlag":
        self._phase.begin()
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self._phase.end()

    def _stop(self, signum: int) -> None:
        self.signal = signum
        self.request("signal {}".format(signum))

    def request(self, why: str) -> None:
        """Stop after the frame in hand; `why` becomes the report's `ended_by`."""
        self.reason = self.reason or why
        self.event.set()

    @property
    def stopped(self) -> bool:
        return self.event.is_set()
