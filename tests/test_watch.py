"""The source recovery policy (edge/sources/watch.py), deterministic: a fake clock and a scripted reader view. No
threads, no sleeps: what the watcher does about a failed, quiet, hung or never-started source, and the backoff."""

from edge.sources.watch import GIVE_UP, REOPEN, REPORT, WAIT, Backoff, ReaderView, Watch


def watch(give_up_at_start=True, timeout_s=1.0, start_timeout_s=5.0):
    return Watch(started=0.0, timeout_s=timeout_s, start_timeout_s=start_timeout_s, backoff=Backoff(0.1, 0.4),
                 give_up_at_start=give_up_at_start)


def names(verdict):
    return [name for name, _ in verdict.events]


def test_backoff_doubles_up_to_its_maximum_and_resets():
    backoff = Backoff(0.1, 0.4)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.4, 0.4]
    backoff.reset()
    assert backoff.next() == 0.1
    assert Backoff(2.0, 1.0).maximum == 2.0  # a maximum below the first delay is the first delay


def test_a_healthy_source_is_left_alone_until_its_timeout():
    w = watch()
    verdict = w.decide(0.5, ReaderView(live=True, last_frame=0.4))
    assert verdict.action == WAIT and not verdict.events and verdict.wake_at == 1.4


def test_a_failed_reader_is_reopened_after_the_backoff_and_failed_reopens_back_off_further():
    w = watch()
    assert w.decide(1.0, ReaderView(live=True, last_frame=0.9, failed_at=1.0)).wake_at == 1.1
    assert w.decide(1.05, ReaderView(live=True, last_frame=0.9, failed_at=1.0)).action == WAIT
    assert w.decide(1.1, ReaderView(live=True, last_frame=0.9, failed_at=1.0)).action == REOPEN
    retries = []
    t = 1.1
    for _ in range(3):  # each reopen fails at once: the new reader is failed again
        verdict = w.decide(t, ReaderView(live=True, last_frame=0.9, failed_at=t, last_fault="device busy"))
        assert names(verdict)[:1] == ["source_reconnect_failed"]
        retries.append(verdict.events[0][1]["retry_in_s"])
        t += retries[-1]
        assert w.decide(t, ReaderView(live=True, last_frame=0.9, failed_at=t - retries[-1])).action == REOPEN
    assert retries == [0.2, 0.4, 0.4]


def test_a_frame_after_a_reopen_starts_the_next_backoff_afresh():
    w = watch()
    w.decide(0.0, ReaderView(live=True, last_frame=0.0, failed_at=0.0))
    assert w.decide(0.1, ReaderView(live=True, last_frame=0.0, failed_at=0.0)).action == REOPEN
    w.decide(0.2, ReaderView(live=True, last_frame=0.2))  # the new reader gave a frame
    assert w.decide(0.5, ReaderView(live=True, last_frame=0.4, failed_at=0.5)).wake_at == 0.6  # 0.1 again


def test_a_quiet_source_is_reported_every_timeout_then_less_often_and_its_recovery_once():
    w = watch()
    lines = [names(w.decide(t, ReaderView(live=True, last_frame=0.0))) for t in [1.0 + 0.5 * i for i in range(20)]]
    timeouts = [i for i, line in enumerate(lines) if line == ["source_timeout"]]
    assert timeouts == [0, 2, 4] and w.timeouts == 10  # counted each timeout_s; logged the first three
    verdict = w.decide(40.0, ReaderView(live=True, last_frame=0.0))
    assert names(verdict) == ["source_timeout"]  # then every 30 s
    verdict = w.decide(40.5, ReaderView(live=True, last_frame=40.2))
    assert verdict.action == REPORT
    assert verdict.events == [("source_recovered", {"down_s": 40.2})]  # down since its last frame
    assert not w.decide(40.6, ReaderView(live=True, last_frame=40.5)).events


def test_a_hung_read_is_abandoned_for_a_fresh_capture_and_an_open_gets_the_start_timeout():
    w = watch(timeout_s=1.0, start_timeout_s=5.0)
    opening = ReaderView(live=True, last_frame=None, busy_since=0.0, opening=True)
    assert w.decide(1.0, opening).action != REOPEN  # a camera may take seconds to open
    w2 = watch(give_up_at_start=False)
    assert w2.decide(5.0, ReaderView(live=True, busy_since=0.0, opening=True)).fresh
    w3 = watch()
    reading = ReaderView(live=True, last_frame=2.0, busy_since=2.0)
    assert w3.decide(2.9, reading).action == WAIT
    verdict = w3.decide(3.0, reading)
    assert verdict.action == REOPEN and verdict.fresh and verdict.events[0][1]["hung_read_restarted"]
    files = ReaderView(live=False, last_frame=2.0, busy_since=2.0)  # a file's read is never abandoned
    assert watch().decide(3.5, files).action != REOPEN


def test_no_first_frame_gives_up_or_under_systemd_says_so_once_and_goes_on():
    view = ReaderView(live=True, failed_at=4.0, last_fault="cannot open source")
    verdict = watch().decide(5.0, view)
    assert verdict.action == GIVE_UP and verdict.error == "no frame within 5 s of start (last fault: cannot open " \
                                                           "source)"
    w = watch(give_up_at_start=False)
    assert "source_start_timeout" in names(w.decide(5.0, view))
    assert "source_start_timeout" not in names(w.decide(6.0, view))  # once
