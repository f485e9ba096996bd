"""The one frame loop: `edge run`, `edge check` (and the rebuild's latency step through it), `edge demo`, the soak
and the benchmarks all run frames through `run()`, giving it their Runtime (with their sinks) and a StopFlag.

It ends with the end of a file source, `runtime.frames` timed frames, or a stop request: SIGTERM/SIGINT (with the
flag entered) or a sink's `stop.request(why)`, each after the frame in hand; then it returns the final report.
A source that gives no first frame in time (a dead camera or stream; under systemd it is waited for instead, see
edge/sources/source.py) and any failure to start are one-line errors, exit 2; more than
`runtime.max_consecutive_errors` failed frames in a row exit 1, so systemd's
Restart=on-failure restarts the service.
"""

import sys
from typing import Any, Dict, Optional

from edge.errors import EXIT_FAIL, EdgeError
from edge.infer.latency import format_table
from edge.infer.pipeline import TooManyErrors
from edge.service.runtime import Runtime
from edge.service.signals import StopFlag
from edge.sources.cameras import format_cameras


def run(runtime: Runtime, stop: Optional[StopFlag] = None, table: Optional[str] = None) -> Dict[str, Any]:
    """THE frame loop; returns the final report (stage statistics, counters, ended_by). Without `stop`, only the
    source or `runtime.frames` end it (Ctrl-C stays Python's KeyboardInterrupt). With `table` (the command's
    name) the report is also printed as a table on stderr, failure or not."""
    stop = stop or StopFlag()
    with runtime as rt:
        try:
            for frame in rt.frames(stop):
                rt.process(frame)
        except TooManyErrors as exc:
            _finish(rt, table, exc)
        return _finish(rt, table, None)


def _finish(runtime: Runtime, table: Optional[str], failure: Optional[TooManyErrors]) -> Dict[str, Any]:
    """Report (log line, systemd status, the table) and return it; raise EdgeError (exit 1) after a failure."""
    report = runtime.final_report(failure)
    if table and report["frames"]:
        header = "{}: {} on {} - {}".format(table, runtime.facts.get("backend", "?"), runtime.facts.get("source"),
                                           runtime.stages.provenance)
        text = format_table(report, [header])
        if "cameras" in report:
            text += "\n" + format_cameras(report)
        print(text, file=sys.stderr, flush=True)
    if failure is not None:
        raise EdgeError(" ".join(str(failure).split()), EXIT_FAIL) from failure  # one line
    return report
