"""One JSON object per line on stdout; under systemd (JOURNAL_STREAM set) each line gets a syslog
priority prefix (<3> error, <4> warning, <6> info) that journald turns into the entry's priority.

`quiet` events (`edge run` without --json: the per-frame `frame_miss`) are not written to a terminal or a pipe, only
to the journal: a loaded machine's hundreds of misses would bury the table; the summaries and metrics count them.

A line that cannot be written (stdout on a full disk, a closed pipe) is dropped and counted, never fatal: inference
goes on, and the next line written carries `log_lines_dropped`. A line goes to the file descriptor in one
unbuffered write, so nothing dropped is left in a buffer to fail again at exit. Never a bare NaN: a non-finite
number is written as a string."""

import json
import math
import os
import sys
import time
from typing import Any, Dict, Optional, Sequence, TextIO

from edge.uri import redact

_PRIORITY = {"error": 3, "warning": 4, "info": 6, "debug": 7}


def _finite(value: Any) -> Any:
    """`value` with every non-finite float (anywhere in it) as its string: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class JsonLog:
    def __init__(self, stream: Optional[TextIO] = None, extra: Optional[Dict[str, Any]] = None,
                 quiet: Sequence[str] = ()):
        self.stream = stream or sys.stdout
        self.prefix = "JOURNAL_STREAM" in os.environ
        self.extra = dict(extra or {})  # fields on every line (e.g. the untrained-weights warning)
        self.dropped = 0  # lines that could not be written
        self.quiet = () if self.prefix else tuple(quiet)  # the journal gets every event

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        if event in self.quiet:
            return
        record = {"ts": round(time.time(), 3), "level": level, "event": event}
        record.update(fields)
        record.update(self.extra)
        if self.dropped:
            record["log_lines_dropped"] = self.dropped
        try:
            text = json.dumps(record, separators=(",", ":"), default=str, allow_nan=False)
        except ValueError:
            text = json.dumps(_finite(record), separators=(",", ":"), default=str)
        line = redact(text)  # no password in any log line
        if self.prefix:
            line = "<{}>{}".format(_PRIORITY[level], line)
        try:
            self._write(line + "\n")
        except OSError:
            self.dropped += 1

    def _write(self, text: str) -> None:
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):  # not a file (a test's StringIO)
            self.stream.write(text)
            self.stream.flush()
            return
        self.stream.flush()  # what was printed before this line stays before it
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(fd, data):]
