"""edge.service.loop: THE frame loop ends with the source, the frame count or a stop request after the frame in hand,
prints the table when asked, and turns too many failed frames in a row into an exit-1 error."""

import pytest
import service_helpers as sh

from edge.errors import EdgeError
from edge.service.loop import run
from edge.service.runtime import Runtime
from edge.service.signals import StopFlag


def test_run_turns_too_many_errors_into_an_exit_code_1_edge_error(small_model):
    backend = sh.ControlledBackend(small_model, fail_every=1)
    cfg = sh.service_config(small_model, **{"runtime.max_consecutive_errors": 2})
    with pytest.raises(EdgeError) as info:
        sh.run_in_process(cfg, sh.ListLog(), stages_factory=sh.stages_with(backend))
    assert info.value.exit_code == 1 and "3 consecutive frames failed" in str(info.value)


class StopAfter:
    """A sink that asks the loop to stop once it has seen `count` results."""

    def __init__(self, stop, count):
        self.stop, self.count, self.seen = stop, count, 0

    def on_result(self, result):
        self.seen += 1
        if self.seen == self.count:
            self.stop.request("enough")

    def close(self):
        pass


def test_a_sinks_stop_request_ends_the_loop_after_the_frame_in_hand(small_model):
    stop = StopFlag()
    sink = StopAfter(stop, 3)
    runtime = Runtime(sh.service_config(small_model, **{"runtime.frames": 50}), [sink], sh.ListLog())
    report = run(runtime, stop)
    assert report["ended_by"] == "enough" and sink.seen == 3  # no frame after the request


def test_the_frame_count_ends_it_and_the_table_is_printed_when_asked(small_model, capsys):
    report = run(Runtime(sh.service_config(small_model, **{"runtime.frames": 4}), log=sh.ListLog()),
                 table="edge check")
    assert report["ended_by"] == "frames" and report["frames"] == 4
    table = capsys.readouterr().err
    assert table.startswith("edge check: onnxruntime on ") and "end_to_end" in table
