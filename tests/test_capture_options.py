"""edge.model.capture_options: the capture flags of `edge calibrate capture` and `edge rebuild` are one declaration,
each command with its own default."""

import dataclasses

from edge.model.capture_options import CaptureOptions
from edge.model.rebuild_options import RebuildOptions


def test_the_capture_flags_share_one_declaration_with_each_commands_default():
    capture = {f.name: f for f in dataclasses.fields(CaptureOptions)}
    again = {f.name: f for f in dataclasses.fields(RebuildOptions)}
    for name in capture:
        assert capture[name].metadata == again[name].metadata, name  # help, bounds and flag: the same
    assert (CaptureOptions().capture_frames, RebuildOptions().capture_frames) == (0, 3000)
