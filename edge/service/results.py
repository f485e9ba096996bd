"""The result sink (`service.results.path`): every delivered frame's result as one JSON line, for another program to
consume, from a regular file (appended) or a FIFO (`mkfifo`) it reads:

    {"ts": 1767225600.123, "frame": 42, "seq": 42, "status": "ok", "end_to_end_ms": 12.41,
     "top": [{"index": 3, "label": "triangle", "score": 0.9712}, ...]}

plus "camera" (several cameras) and, for a failed frame ("status": "error", no "top"), "error"; "dropped": how many
lines were dropped before this one. Warm-up frames are not delivered, so not written.

The frame path never waits for it: `on_result` formats the line and hands it to a bounded queue; a writer thread
writes it. A full queue (a stalled disk) drops the line. A FIFO is opened and written without blocking: while no
program reads it, or its reader falls behind, lines are dropped (a line begun is finished, so a reader never sees
half of one), and it is opened again at most once a second. A symlink, a folder, or a file another user owns is
refused at start (one line, exit 2).
"""

import json
import os
import queue
import select
import stat
import threading
import time
from typing import Any, Dict, List, Optional

from edge.errors import EdgeError
from edge.infer.pipeline import Result, Sink
from edge.store.fileio import check_folder

MAX_PENDING = 1024  # lines waiting for the writer; more are dropped
REOPEN_S = 1.0  # a FIFO without a reader is tried again this often
CLOSE_S = 2.0  # how long close() waits for the writer to drain


def results_sinks(cfg: Any) -> List[Sink]:
    """The sinks `service.results` (edge.config.ResultsConfig) asks for: none, or the one writing `path`."""
    return [ResultsSink(cfg.path)] if cfg.path else []


def result_line(result: Result) -> Dict[str, Any]:
    line: Dict[str, Any] = {"ts": round(time.time(), 3), "frame": result.frame_id, "seq": result.seq,
                            "status": result.status}
    if result.camera:
        line["camera"] = result.camera
    if result.prediction is not None:
        line["end_to_end_ms"] = round(result.stage_ms["end_to_end"], 3)
        line["top"] = result.prediction.as_dict()["top"]
    else:
        line["error"] = result.error
    return line


def _check_path(path: str) -> bool:
    """True for a FIFO, False for a regular file (or none yet); anything else is one EdgeError."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise EdgeError("{}: cannot write the results: no folder {}".format(path, folder)) from None
        check_folder(path, "results")
        return False
    what = ("a symlink" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else
            "owned by another user" if st.st_uid not in (os.geteuid(), 0) else
            "" if stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) else "not a file or a FIFO")
    if what:
        raise EdgeError("{}: service.results.path is {}; give a regular file or a FIFO (mkfifo)".format(path, what))
    return stat.S_ISFIFO(st.st_mode)


class ResultsSink(Sink):
    def __init__(self, path: str):
        self.path = path
        self.fifo = _check_path(path)
        self.pending: "queue.Queue[Optional[bytes]]" = queue.Queue(MAX_PENDING)
        self.dropped = 0  # lines not written, since the last one written
        self.dropped_total = 0
        self.written = 0
        self._fd: Optional[int] = None
        self._tried = -REOPEN_S
        self._thread = threading.Thread(target=self._write_all, name="edge-results", daemon=True)
        self._thread.start()

    def on_result(self, result: Result) -> None:
        data = (json.dumps(result_line(result), separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
        try:
            self.pending.put_nowait(data)
        except queue.Full:
            self._drop()

    def close(self) -> None:
        try:
            self.pending.put(None, timeout=CLOSE_S)
        except queue.Full:
            pass
        self._thread.join(CLOSE_S)
        if self._fd is not None and not self._thread.is_alive():
            os.close(self._fd)
            self._fd = None

    def _drop(self) -> None:
        self.dropped += 1
        self.dropped_total += 1

    def _write_all(self) -> None:
        while True:
            data = self.pending.get()
            if data is None:
                return
            if self.dropped:
                data = data[:-2] + b',"dropped":' + str(self.dropped).encode() + b"}\n"
            if self._open() and self._write(data):
                self.written += 1
                self.dropped = 0
            else:
                self._drop()

    def _open(self) -> bool:
        if self._fd is not None:
            return True
        now = time.monotonic()
        if now - self._tried < REOPEN_S:  # a FIFO no program reads yet (ENXIO), a file that cannot be opened
            return False
        self._tried = now
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if self.fifo else os.O_APPEND | os.O_CREAT)
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError:
            return False
        return True

    def _write(self, data: bytes) -> bool:
        """The whole line, or (nothing of it could be written) False. A FIFO whose reader left is closed."""
        assert self._fd is not None
        done = 0
        while done < len(data):
            try:
                done += os.write(self._fd, data[done:])
            except BlockingIOError:
                if not done:
                    return False  # the reader is behind: this line is dropped
                select.select([], [self._fd], [], REOPEN_S)  # finish the line begun
            except OSError:  # EPIPE: the reader went away; a disk error
                os.close(self._fd)
                self._fd = None
                return False
        return True
