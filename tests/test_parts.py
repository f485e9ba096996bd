"""edge.service.parts: the log's warning tag follows the serving model, on every line of the real JsonLog."""

import io
import json
from types import SimpleNamespace

from edge.service.log import JsonLog
from edge.service.parts import WarningTag


def test_the_warning_tag_is_on_every_log_line_while_the_serving_model_has_one(monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    stream = io.StringIO()
    log = JsonLog(stream=stream)
    tag = WarningTag(log.extra)
    tag.serving(SimpleNamespace(warning="UNTRAINED WEIGHTS"))
    log("start")
    log("summary")
    tag.serving(SimpleNamespace(warning=None))  # a reload serves a sound model: the tag goes
    log("reload")
    tag.serving(SimpleNamespace(warning=None))
    log("report")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["event"], r.get("warning")) for r in lines] == [
        ("start", "UNTRAINED WEIGHTS"), ("summary", "UNTRAINED WEIGHTS"), ("reload", None), ("report", None)]
