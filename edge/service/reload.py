"""A SIGHUP reload, loaded beside the model that serves.

The new config is read and its stages are built and proven (run once on the latest frame) in a thread of their
own, while the frame loop goes on serving with the old stages and pinging the watchdog after each frame. The loop
swaps between two frames once the load is done (edge.service.runtime.Runtime.finish_reload); a load that fails
leaves the old stages serving. So a TensorRT engine whose load outlasts WatchdogSec does not get a healthy service
killed, and no frame goes unserved while it loads. A SIGHUP that arrives during a load asks for one more load once
this one is over (the config may have changed again since it was read).
"""

import threading
import time
from typing import Any, Callable, Optional, Tuple

LOAD_CLOSE_WAIT_S = 30.0  # at close, how long a load still in flight may take before its result is left behind


class Loading:
    """`load()` run in a thread; `done`, then `result` (whatever load returned) or `error` (what it raised)."""

    def __init__(self, load: Callable[[], Tuple[Any, Any]]):
        self.started = time.monotonic()
        self.again = False  # another SIGHUP came during this load
        self.result: Optional[Tuple[Any, Any]] = None
        self.error: Optional[BaseException] = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(load,), name="edge-reload", daemon=True)
        self._thread.start()

    def _run(self, load: Callable[[], Tuple[Any, Any]]) -> None:
        try:
            self.result = load()
        except BaseException as exc:  # reported by the frame loop's thread, which owns the log and the swap
            self.error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        return self._done.wait(timeout_s)

    def discard(self) -> None:
        """The runtime closes during the load: release what it loaded, if it finishes in time."""
        if self.wait(LOAD_CLOSE_WAIT_S) and self.result is not None:
            self.result[1].close()
