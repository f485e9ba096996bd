"""The service's parts beside the frame path (metrics, the frame log, systemd notify, the log's warning tag).

Each is a Sink that Runtime also tells which stages serve (at start and after each reload) and how each reload
ended; Runtime tells every part the same things, so a new part is a subclass here or beside its owner and one
line in `Runtime._start_services`, and a new fact for the parts is one hook here.
"""

from typing import Any

from edge.infer.pipeline import Result, Sink


class ServicePart(Sink):
    def on_result(self, result: Result) -> None:
        pass

    def serving(self, stages: Any) -> None:
        """`stages` (edge.infer.stages.Stages) serve from now on: at start and after each reload."""

    def reload_done(self, outcome: str) -> None:
        """A reload ended: "ok" (the new stages serve, `serving` was told first) or "failed" (the old ones do)."""


class WarningTag(ServicePart):
    """The serving model's warning (untrained weights) on every log line, and off when a reload serves a sound one."""

    def __init__(self, extra: Any):
        self.extra = extra  # JsonLog.extra

    def serving(self, stages: Any) -> None:
        if stages.warning:
            self.extra["warning"] = stages.warning
        else:
            self.extra.pop("warning", None)
