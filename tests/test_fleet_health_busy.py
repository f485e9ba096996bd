"""edge/fleet/health.py's bake against a real HTTP endpoint on a fake clock: a 503 (every metrics slot busy, issue
39) is skipped, never read as the release stopping; a bake that read nothing but 503s is inconclusive, not failed."""

import http.server
import threading

import pytest

from edge.fleet import health

RELEASE = "r2"


def metrics(frames, misses, started=100.0, release=RELEASE):
    return ("# TYPE edge_build_info gauge\nedge_build_info{{release=\"{}\"}} 1\n"
            "# TYPE edge_frames_total counter\nedge_frames_total{{status=\"ok\"}} {}\n"
            "edge_frames_total{{status=\"miss\"}} {}\n"
            "# TYPE edge_deadline_misses_total counter\nedge_deadline_misses_total {}\n"
            "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {}\n").format(
                release, frames - misses, misses, misses, started)


@pytest.fixture
def endpoint():
    """A /metrics that answers the queued bodies in turn (None: a 503), then repeats the last one."""
    answers = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = answers.pop(0) if len(answers) > 1 else answers[0]
            if body is None:
                self.send_error(503, "every metrics slot is busy")
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield answers, "http://127.0.0.1:{}/metrics".format(server.server_address[1])
    server.shutdown()
    server.server_close()


def bake(url):
    now = [0.0]

    def sleep(seconds):
        now[0] += max(seconds, 0.5)

    return health.bake(url, RELEASE, bake_s=10, start_timeout_s=5, max_miss_ratio=0.05, interval_s=1,
                       abort=lambda: None, clock=lambda: now[0], sleep=sleep)


def test_a_503_in_the_middle_of_a_bake_is_skipped(endpoint):
    answers, url = endpoint
    answers[:] = [metrics(100, 0), None, None, metrics(300, 1)]
    verdict = bake(url)
    assert verdict.ok and "200 frames" in verdict.why, verdict


def test_a_bake_that_reads_only_503s_is_inconclusive_not_failed(endpoint):
    answers, url = endpoint
    answers[:] = [metrics(100, 0), None]
    verdict = bake(url)
    assert verdict.ok is None and not verdict.aborted and "503" in verdict.why, verdict
    answers[:] = [None]  # busy from the start
    verdict = bake(url)
    assert verdict.ok is None and "503" in verdict.why, verdict


def test_a_daemon_that_stops_answering_or_restarts_still_fails_the_bake(endpoint):
    answers, url = endpoint
    answers[:] = [metrics(100, 0), metrics(150, 0, started=200.0)]
    verdict = bake(url)
    assert verdict.ok is False and "restarted" in verdict.why, verdict
    answers[:] = [metrics(100, 0), metrics(300, 100)]
    verdict = bake(url)
    assert verdict.ok is False and "over 0.05" in verdict.why, verdict
