"""edge.service.reload.Loading: a SIGHUP's load runs beside the serving stages and reports how it ended; a load
still in flight at close releases what it loaded once it finishes. Each test waits for the load's event."""

import threading

import pytest

from edge.service import reload


class Closable:
    def __init__(self):
        self.closed = threading.Event()

    def close(self):
        self.closed.set()


def test_a_load_runs_in_its_own_thread_and_keeps_its_result():
    go, seen = threading.Event(), []

    def load():
        seen.append(threading.current_thread().name)
        go.wait(10)
        return "cfg", Closable()

    loading = reload.Loading(load)
    assert not loading.done  # the caller goes on serving meanwhile
    go.set()
    assert loading.wait(10) and loading.done
    assert seen == ["edge-reload"] and loading.error is None and loading.result[0] == "cfg"


def test_a_failed_load_keeps_what_it_raised_for_the_frame_loop():
    def load():
        raise ValueError("bad config")

    loading = reload.Loading(load)
    assert loading.wait(10)
    assert loading.result is None and isinstance(loading.error, ValueError)


def test_discard_releases_what_the_load_made(monkeypatch):
    go, stages = threading.Event(), Closable()
    loading = reload.Loading(lambda: (go.wait(10), stages))
    go.set()
    loading.discard()
    assert stages.closed.is_set()


def test_discard_leaves_a_load_that_outlasts_the_close_wait(monkeypatch):
    monkeypatch.setattr(reload, "LOAD_CLOSE_WAIT_S", 0.0)
    go, stages = threading.Event(), Closable()
    loading = reload.Loading(lambda: (go.wait(10), stages))
    loading.discard()  # not done yet: left behind, nothing closed under it
    assert not stages.closed.is_set()
    go.set()
    assert loading.wait(10)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_even_an_interrupt_in_the_load_is_reported_not_lost(raised):
    def load():
        raise raised()

    loading = reload.Loading(load)
    assert loading.wait(10) and isinstance(loading.error, raised)
