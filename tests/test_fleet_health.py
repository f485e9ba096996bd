"""edge.fleet.health: the bake judges a release by the running daemon's own /metrics, scraped over HTTP from a
stand-in endpoint whose figures the test moves on a fake clock (each sleep of the bake is one step)."""

import http.server
import threading

import pytest

from edge.fleet.health import bake, scrape

METRICS = """# TYPE edge_build_info gauge
edge_build_info{{release="{release}",version="test"}} 1.0
# TYPE edge_frames_total counter
edge_frames_total{{status="ok"}} {ok}
edge_frames_total{{status="miss"}} {misses}
edge_frames_total{{status="error"}} 7.0
# TYPE edge_deadline_misses_total counter
edge_deadline_misses_total {misses}
# TYPE process_start_time_seconds gauge
process_start_time_seconds {started}
"""


class Daemon:
    """What a daemon's /metrics says now; `step()` is one bake interval of serving."""

    def __init__(self, release="r1", ok_per_step=100.0, misses_per_step=0.0):
        self.figures = {"release": release, "ok": 0.0, "misses": 0.0, "started": 1000.0}
        self.ok_per_step, self.misses_per_step = ok_per_step, misses_per_step
        self.on_step = []  # changes made at a given step: {step: {figure: value}}
        self.busy = set()  # steps at which every metrics slot is taken: /metrics answers 503
        self.steps = 0

    def step(self):
        self.steps += 1
        self.figures["ok"] += self.ok_per_step
        self.figures["misses"] += self.misses_per_step
        for step, change in self.on_step:
            if step == self.steps:
                self.figures.update(change)

    def text(self):
        return METRICS.format(**self.figures) if self.figures["release"] is not None else "# nothing\n"


@pytest.fixture
def daemon():
    state = Daemon()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if state.steps in state.busy:
                self.send_error(503, "every metrics slot is busy")
                return
            body = state.text().encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = "http://127.0.0.1:{}/metrics".format(server.server_address[1])
    yield state
    server.shutdown()
    server.server_close()
    thread.join(10)


def judge(daemon, release="r1", abort=lambda: None, **limits):
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
        daemon.step()

    settings = dict(bake_s=5.0, start_timeout_s=3.0, max_miss_ratio=0.05, interval_s=1.0)
    settings.update(limits)
    return bake(daemon.url, release, abort=abort, clock=lambda: now[0], sleep=sleep, **settings)


def test_a_scrape_reads_the_release_and_completed_frames(daemon):
    daemon.figures.update(ok=90.0, misses=10.0)
    sample = scrape(daemon.url)
    assert sample == ("r1", 1000.0, 100.0, 10.0)  # errors are not completed frames
    daemon.figures["release"] = None
    assert scrape(daemon.url) is None  # answers, but is not jetson-edge
    assert scrape("http://127.0.0.1:1/metrics") is None


def test_a_release_that_serves_its_frames_in_budget_passes(daemon):
    daemon.misses_per_step = 1.0  # 1 in 101: within 5 %
    verdict = judge(daemon)
    assert verdict.ok and not verdict.aborted
    assert verdict.why == "5 s bake: 505 frames, miss ratio 0.0099"


def test_too_many_misses_fail_the_bake(daemon):
    daemon.misses_per_step = 10.0
    verdict = judge(daemon)
    assert not verdict.ok and verdict.why == "5 s bake: 550 frames, miss ratio 0.0909 over 0.05"


def test_a_restart_or_silence_during_the_bake_fails_it(daemon):
    daemon.on_step = [(2, {"started": 2000.0})]
    assert judge(daemon).why == "the service restarted during the bake"
    daemon.on_step, daemon.steps = [(2, {"release": None})], 0
    daemon.figures["started"] = 1000.0
    assert judge(daemon).why == "the service stopped answering during the bake"


def test_a_503_in_the_middle_of_a_bake_is_skipped(daemon):
    """Issue 39: slow clients held every metrics slot; a busy answer is no figure, never the release stopping."""
    daemon.busy = {2, 3}
    verdict = judge(daemon)
    assert verdict.ok and verdict.why == "5 s bake: 500 frames, miss ratio 0.0000", verdict


def test_a_bake_that_reads_only_503s_is_inconclusive_not_failed(daemon):
    daemon.busy = set(range(1, 20))  # busy once the bake has its first sample
    verdict = judge(daemon)
    assert verdict.ok is None and not verdict.aborted and "503" in verdict.why, verdict
    daemon.steps, daemon.busy = 0, set(range(0, 20))  # busy from the start
    verdict = judge(daemon)
    assert verdict.ok is None and "503" in verdict.why, verdict


def test_the_release_must_be_served_within_the_start_timeout(daemon):
    daemon.figures["release"] = "r0"  # the old release goes on serving
    verdict = judge(daemon)
    assert not verdict.ok and verdict.why == (
        "the service did not serve r1 within 3 s (release 'r0' at {})".format(daemon.url))
    daemon.on_step, daemon.steps = [(2, {"release": "r1"})], 0  # served after two intervals: the bake starts then
    assert judge(daemon).ok


def test_no_frame_in_the_bake_fails_it(daemon):
    daemon.ok_per_step = 0.0
    assert judge(daemon).why == "no frame completed in the 5 s bake"


def test_a_withdrawal_ends_the_bake_at_once(daemon):
    asked = []

    def abort():
        asked.append(daemon.steps)
        return "withdrawn by bob" if daemon.steps >= 2 else None

    verdict = judge(daemon, abort=abort)
    assert verdict == (False, "withdrawn by bob", True) and asked[-1] == 2
