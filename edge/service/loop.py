"""The one frame loop: `edge run`, `edge check`, `edge demo`, the rebuild's latency step, the soak and the
benchmarks all run frames through `run()`, giving it only their sinks (on the Runtime) and a stop condition.

The loop owns warm-up (`runtime.warmup` frames, timed but not recorded), the end of a file source, a live
source's timeouts and reconnects (through Runtime.next_frame), too many consecutive errors, and the stop and
reload signals: SIGTERM/SIGINT finish the frame in hand and return the report; SIGHUP reloads the config and
swaps to the model it names between two frames (the old stages keep serving if the new ones fail). A source
that gives no first frame in time (a dead camera or stream) and any failure to start are one-line errors,
exit 2; more than `runtime.max_consecutive_errors` failed frames in a row exit 1, so systemd's
Restart=on-failure restarts the service.
"""

import sys
from typing import Any, Callable, Dict, Optional, Tuple

from edge.config import Config, load_config
from edge.errors import EXIT_FAIL, EdgeError
from edge.frame.latency import format_table
from edge.frame.pipeline import Pipeline, TooManyErrors
from edge.frame.sources import SourceEnded
from edge.service.log import JsonLog
from edge.service.runtime import Runtime, StopFlag

Until = Callable[[Pipeline], Optional[str]]  # a command's stop condition: why to stop, or None to go on


def frames_done(count: int) -> Until:
    """Stop after `count` timed frames (0: never)."""
    return lambda pipeline: "frames" if count and pipeline.recorder.frames >= count else None


def run(cfg: Optional[Config] = None, log: Optional[JsonLog] = None, stop: Optional[StopFlag] = None,
        reload_config: Optional[Callable[[], Config]] = None, runtime: Optional[Runtime] = None,
        until: Optional[Until] = None, table: Optional[str] = None) -> Dict[str, Any]:
    """THE frame loop. Runs until `until` says why to stop (default: `runtime.frames` timed frames), the end of
    the source, or a stop signal; returns the final report (stage statistics, source counters, ended_by).
    With `table` (the command's name) the report is also printed as a table on stderr, failure or not.

    `reload_config` builds the config SIGHUP switches to (default: re-read `cfg.path`, or keep `cfg` and reload
    the model file at the same path when there is no config file)."""
    if stop is None:
        stop = StopFlag()
        stop.install()  # first, so a SIGHUP during start-up does not kill the process
    if runtime is None:
        assert cfg is not None
        runtime = Runtime(cfg, log)
    start_cfg = runtime.cfg
    if reload_config is None:
        path = start_cfg.path
        reload_config = (lambda: load_config(path)) if path else (lambda: start_cfg)
    until = until or frames_done(start_cfg.runtime.frames)
    try:
        pipeline = _start(runtime)
        ended_by, failure = _loop(runtime, pipeline, stop, reload_config, until)
        return _finish(runtime, ended_by, failure, table)
    finally:
        runtime.close()


def _start(runtime: Runtime) -> Pipeline:
    try:
        return runtime.start()
    except EdgeError:
        raise
    except Exception as exc:  # a backend or source failing in its own way: still one line, exit 2
        raise EdgeError("cannot start the pipeline: {}: {}".format(type(exc).__name__, exc)) from None


def _loop(runtime: Runtime, pipeline: Pipeline, stop: StopFlag, reload_config: Callable[[], Config],
          until: Until) -> Tuple[str, Optional[TooManyErrors]]:
    warmup = runtime.cfg.runtime.warmup
    try:
        while True:
            if stop.event.is_set():
                return "signal {}".format(stop.signal), None
            if stop.reload.is_set():
                stop.reload.clear()
                runtime.reload(reload_config)
                continue
            reason = until(pipeline)
            if reason:
                return reason, None
            frame = runtime.next_frame(stop)
            if frame is not None:
                pipeline.process(frame, record=warmup <= 0)  # warm-up: timed, not recorded; errors still count
                warmup -= 1
    except SourceEnded:
        return "end of source", None
    except TooManyErrors as exc:
        return "too many errors", exc
    except EdgeError:
        raise
    except Exception as exc:  # a source that failed in its own way (files and tests: no reconnect)
        raise EdgeError("{}: {}: {}".format(runtime.cfg.source.uri, type(exc).__name__, exc)) from None


def _finish(runtime: Runtime, ended_by: str, failure: Optional[TooManyErrors], table: Optional[str]) -> Dict[str, Any]:
    report = runtime.summary()
    report.pop("frame_lines_suppressed", None)
    report["ended_by"] = ended_by
    notifier = runtime.notifier
    if notifier is not None:
        if failure is not None:
            notifier.status("failed: {}".format(failure))
        else:
            notifier.stopping("stopping ({}): {} frames, {} misses".format(ended_by, report["frames"],
                                                                         report["misses"]))
    runtime.event("report", level="error" if failure is not None else "info", **report)
    if table and report["frames"]:
        header = "{}: {} on {} - {}".format(table, runtime.facts.get("backend", "?"), runtime.facts.get("source"),
                                           runtime.stages.warning or "trained weights")
        print(format_table(report, [header]), file=sys.stderr, flush=True)
    if failure is not None:
        raise EdgeError(" ".join(str(failure).split()), EXIT_FAIL) from failure  # one line
    return report
