"""One JSON object per line on stdout; under systemd (JOURNAL_STREAM set) each line gets a syslog
priority prefix (<3> error, <4> warning, <6> info) that journald turns into the entry's priority."""

import json
import os
import sys
import time
from typing import Any, Dict, Optional, TextIO

from edge.uri import redact

_PRIORITY = {"error": 3, "warning": 4, "info": 6, "debug": 7}


class JsonLog:
    def __init__(self, stream: Optional[TextIO] = None, extra: Optional[Dict[str, Any]] = None):
        self.stream = stream or sys.stdout
        self.prefix = "JOURNAL_STREAM" in os.environ
        self.extra = dict(extra or {})  # fields on every line (e.g. the untrained-weights warning)

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        record = {"ts": round(time.time(), 3), "level": level, "event": event}
        record.update(fields)
        record.update(self.extra)
        line = redact(json.dumps(record, separators=(",", ":"), default=str))  # no password in any log line
        if self.prefix:
            line = "<{}>{}".format(_PRIORITY[level], line)
        self.stream.write(line + "\n")
        self.stream.flush()
