"""edge.service.log: one JSON object per line, never a bare NaN and never a password; under systemd each line has its
priority prefix and quiet events are written too; a line that cannot be written is dropped and counted, never fatal."""

import io
import json
import os
import subprocess
import sys

import pytest
import service_helpers as sh

from edge.service.log import JsonLog

from conftest import REPO


def lines_of(stream):
    return stream.getvalue().splitlines()


def test_a_non_finite_number_is_written_as_a_string_and_a_password_never(monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    stream = io.StringIO()
    JsonLog(stream)("start", ms=float("nan"), nested={"p99": [1.5, float("inf")]},
                    source="rtsp://admin:S3cretPass@10.0.0.2/stream")
    (line,) = lines_of(stream)
    record = json.loads(line)
    assert record["event"] == "start" and record["ms"] == "nan" and record["nested"] == {"p99": [1.5, "inf"]}
    assert "S3cretPass" not in line and "10.0.0.2/stream" in record["source"]


def test_under_the_journal_each_line_has_its_priority_and_quiet_events_are_written(monkeypatch):
    stream = io.StringIO()
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    terminal = JsonLog(stream, quiet=("frame_miss",))
    terminal("frame_miss", "warning")
    terminal("summary")
    assert [json.loads(line)["event"] for line in lines_of(stream)] == ["summary"]
    monkeypatch.setenv("JOURNAL_STREAM", "8:1")
    stream = io.StringIO()
    journal = JsonLog(stream, quiet=("frame_miss",))
    journal("frame_miss", "warning")
    journal("reload_failed", "error")
    journal("summary")
    assert [line[:3] for line in lines_of(stream)] == ["<4>", "<3>", "<6>"]
    assert json.loads(lines_of(stream)[0][3:])["event"] == "frame_miss"


class FailingOnce(io.StringIO):
    """A stream whose first `failures` writes fail as a full disk's would."""

    def __init__(self, failures):
        super().__init__()
        self.failures = failures

    def write(self, text):
        if self.failures:
            self.failures -= 1
            raise OSError(28, "No space left on device")
        return super().write(text)


def test_a_line_that_cannot_be_written_is_counted_and_the_next_line_says_so(monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    log = JsonLog(FailingOnce(2))
    for n in range(3):
        log("summary", frames=n)
    (line,) = lines_of(log.stream)
    record = json.loads(line)
    assert record["frames"] == 2 and record["log_lines_dropped"] == 2
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w", encoding="utf-8") as full:  # a real file descriptor on a full disk
            on_full = JsonLog(full)
            on_full("summary")
            assert on_full.dropped == 1


def test_a_full_disk_under_stdout_drops_log_lines_and_inference_goes_on(small_model, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    cfg = tmp_path / "c.yaml"
    sh.write_config(cfg, {"runtime": {"frames": 5, "warmup": 0}, "backend": sh.QUIET_ORT,
                          "source": {"width": 96, "height": 72}})
    with open("/dev/full", "w", encoding="utf-8") as full:
        proc = subprocess.run([sys.executable, "-m", "edge", "run", "--config", str(cfg), "--model", small_model,
                               "--source", "synthetic"], stdout=full, stderr=subprocess.PIPE,
                              encoding="utf-8", errors="replace", cwd=REPO, timeout=120)
    # before: OSError "No space left on device" from the first log line, exit 1, and systemd restarts it forever
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "No space left" not in proc.stderr and "end_to_end" in proc.stderr  # the closing table on stderr
