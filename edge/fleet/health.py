"""The bake: a release that was just switched to proves itself on the device with its own metrics.

The running daemon's /metrics (127.0.0.1, edge/service/metrics.py) is scraped until it reports the release
under trial (edge_build_info{release}), then for `bake_s`: it must keep answering from the same process (no
restart), complete frames (ok + miss) and miss its budget on at most `max_miss_ratio` of them. That is what the
latency gate of the stopped service used to check, on the live camera, with the service never stopped.

A 503 (every metrics slot busy) says nothing about the release: such a scrape is skipped, and a bake that read
nothing else is inconclusive (the trial stays armed; the timer bakes again), never failed.
"""

import time
import urllib.error
import urllib.request
from typing import Callable, Dict, NamedTuple, Optional, Union

from edge.errors import require

SCRAPE_TIMEOUT_S = 5.0


class Sample(NamedTuple):
    release: str
    started: float  # process_start_time_seconds: another value is another process
    frames: float  # completed frames (ok + miss)
    misses: float


class Verdict(NamedTuple):
    ok: Optional[bool]  # None: no verdict (the metrics answered only 503: not the release's fault)
    why: str
    aborted: bool = False  # abort() ended it (the release was withdrawn meanwhile)


BUSY = "busy"  # what _read returns for a 503


def scrape(url: str) -> Optional[Sample]:
    """One scrape of the daemon's /metrics; None when it does not answer or is not jetson-edge."""
    sample = _read(url)
    return sample if isinstance(sample, Sample) else None


def _read(url: str) -> Union[Sample, str, None]:
    """A sample, BUSY (503: the daemon answers, its metrics slots are taken), or None (no jetson-edge answer)."""
    parser = require("prometheus_client.parser")
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as resp:
            text = resp.read(8 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return BUSY if exc.code == 503 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    values: Dict[str, float] = {}
    release = None
    try:
        for family in parser.text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "edge_build_info":
                    release = s.labels.get("release", "")
                elif s.name == "edge_frames_total" and s.labels.get("status") in ("ok", "miss"):
                    values["frames"] = values.get("frames", 0.0) + s.value
                elif s.name in ("edge_deadline_misses_total", "process_start_time_seconds"):
                    values[s.name] = s.value
    except ValueError:
        return None
    if release is None:
        return None
    return Sample(release, values.get("process_start_time_seconds", 0.0), values.get("frames", 0.0),
                  values.get("edge_deadline_misses_total", 0.0))


def bake(url: str, release: str, *, bake_s: float, start_timeout_s: float, max_miss_ratio: float,
         interval_s: float, abort: Callable[[], Optional[str]],
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Verdict:
    """Judge `release` as served at `url`. `abort()` returns a reason to stop at once (a withdrawal)."""
    deadline = clock() + start_timeout_s
    first = _read(url)
    while not isinstance(first, Sample) or first.release != release:
        why = abort()
        if why:
            return Verdict(False, why, aborted=True)
        if clock() >= deadline:
            if first == BUSY:
                return Verdict(None, "{} answered 503 (busy) for {:g} s".format(url, start_timeout_s))
            seen = "release {!r}".format(first.release) if isinstance(first, Sample) else "no answer"
            return Verdict(False, "the service did not serve {} within {:g} s ({} at {})".format(
                release, start_timeout_s, seen, url))
        sleep(interval_s)
        first = _read(url)
    return _judge(url, release, first, bake_s=bake_s, grace_s=start_timeout_s, max_miss_ratio=max_miss_ratio,
                  interval_s=interval_s, abort=abort, clock=clock, sleep=sleep)


def _judge(url: str, release: str, first: Sample, *, bake_s: float, grace_s: float, max_miss_ratio: float,
           interval_s: float, abort: Callable[[], Optional[str]], clock: Callable[[], float],
           sleep: Callable[[float], None]) -> Verdict:
    """The bake from its first sample: `bake_s` of samples, then up to `grace_s` more while every answer is 503."""
    end = clock() + bake_s
    last = first
    while True:
        why = abort()
        if why:
            return Verdict(False, why, aborted=True)
        if clock() >= end and (last is not first or clock() >= end + grace_s):
            break
        sleep(min(interval_s, max(0.0, end - clock())) if clock() < end else interval_s)
        now = _read(url)
        if now == BUSY:
            continue
        if not isinstance(now, Sample) or now.release != release or now.started != first.started:
            return Verdict(False, "the service {} during the bake".format(
                "stopped answering" if now is None else "restarted"))
        last = now
    if last is first:
        return Verdict(None, "{} answered 503 (busy) through the {:g} s bake".format(url, bake_s))
    frames, misses = last.frames - first.frames, last.misses - first.misses
    if frames <= 0:
        return Verdict(False, "no frame completed in the {:g} s bake".format(bake_s))
    ratio = misses / frames
    summary = "{:g} s bake: {:g} frames, miss ratio {:.4f}".format(bake_s, frames, ratio)
    if ratio > max_miss_ratio:
        return Verdict(False, "{} over {:g}".format(summary, max_miss_ratio))
    return Verdict(True, summary)
