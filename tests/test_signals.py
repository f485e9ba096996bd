"""edge.service.signals.StopFlag, with real signals sent to this process: SIGTERM and SIGINT stop after the frame
in hand (the first reason kept), SIGHUP asks for a reload, and the handlers it replaced are back afterwards.
Each signal is waited for through the flag's events."""

import os
import signal

import service_helpers as sh

from edge.service.signals import StopFlag


def test_a_signal_stops_the_loop_and_is_the_reason():
    with StopFlag() as stop:
        assert not stop.stopped
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.event.wait(5) and stop.stopped
        os.kill(os.getpid(), signal.SIGINT)  # a second one keeps the first reason
        assert stop.event.wait(5)
    assert (stop.signal, stop.reason) == (signal.SIGINT, "signal {}".format(int(signal.SIGTERM)))


def test_sighup_asks_for_a_reload_without_stopping():
    with StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGHUP)
        assert stop.reload.wait(5)
    assert not stop.stopped and stop.signal is None


def test_the_replaced_handlers_are_back_afterwards():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with StopFlag():
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_without_with_only_a_request_stops():
    before = signal.getsignal(signal.SIGTERM)
    stop = StopFlag()
    assert signal.getsignal(signal.SIGTERM) is before  # nothing installed
    stop.request("source ended")
    stop.request("too many errors")
    assert stop.stopped and stop.reason == "source ended" and stop.signal is None


def test_stop_flag_serves_signals_inside_and_restores_the_handlers_it_replaced():
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = [signal.getsignal(s) for s in signals]
    with StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGHUP)
        assert sh.wait_until(stop.reload.is_set, 30) and not stop.stopped
        os.kill(os.getpid(), signal.SIGTERM)
        assert sh.wait_until(lambda: stop.stopped, 30) and stop.reason == "signal 15"
    assert [signal.getsignal(s) for s in signals] == before
