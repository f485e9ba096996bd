"""The demo overlay: top-k labels with confidences, per-stage milliseconds, FPS and a green/red budget box,
drawn with cv2.putText/rectangle on a copy of each frame (the pipeline's frame is never written to).

Sizes scale with the frame height (reference 720 px), so a 320x240 clip and a 1080p camera both read well.
"""

import collections
import time
from typing import Any, Deque, Dict, List, Optional

import numpy as np

from edge.errors import require
from edge.infer.pipeline import Result
from edge.store.model_info import UNTRAINED_WARNING

GREEN = (0, 200, 0)  # BGR: frame within budget
RED = (0, 0, 230)  # BGR: frame over budget (or failed)
AMBER = (0, 165, 255)  # BGR: untrained-weights banner
WHITE = (255, 255, 255)
PANEL = (32, 32, 32)
SHOWN_STAGES = (("preprocess", "pre"), ("infer", "infer"), ("postprocess", "post"), ("end_to_end", "e2e"))


class FpsMeter:
    """Frames per second over the last `window` results (the loop's real rate, not 1000 / infer ms)."""

    def __init__(self, window: int = 30):
        self.times: Deque[float] = collections.deque(maxlen=window)

    def tick(self, now: Optional[float] = None) -> float:
        self.times.append(time.monotonic() if now is None else now)
        return self.fps()

    def fps(self) -> float:
        if len(self.times) < 2 or self.times[-1] <= self.times[0]:
            return 0.0
        return (len(self.times) - 1) / (self.times[-1] - self.times[0])


def draw_overlay(image: np.ndarray, result: Result, budget_ms: float, fps: float, trained: bool = True) -> np.ndarray:
    """A new BGR image: `image` with the prediction, stage times, FPS and budget indicator drawn on it."""
    cv2: Any = require("cv2")
    out = image.copy()
    h, w = out.shape[:2]
    scale = max(0.35, h / 720.0 * 0.7)
    thick = max(1, int(round(scale * 2)))
    line_h = int(round(34 * scale / 0.7 * 0.85))
    font = cv2.FONT_HERSHEY_SIMPLEX
    pad = max(4, line_h // 4)

    lines: List[str] = []
    if result.prediction is not None:
        for label, score in zip(result.prediction.labels, result.prediction.scores):
            lines.append("{:5.1f}% {}".format(100.0 * score, label[:28]))
    else:
        lines.append("frame failed: " + (result.error or "?")[:40])
    stages = "  ".join("{} {:.1f}".format(short, result.stage_ms[name]) for name, short in SHOWN_STAGES
                       if name in result.stage_ms)
    lines.append((stages + " ms") if stages else "no timing")
    lines.append("{:.1f} FPS".format(fps))

    # text panel, top left: darkened background, then white text
    width = max(cv2.getTextSize(t, font, scale, thick)[0][0] for t in lines) + 2 * pad
    height = line_h * len(lines) + 2 * pad
    x1, y1 = min(w - 1, width), min(h - 1, height)
    region = out[0:y1, 0:x1]
    region[:] = (region.astype(np.uint16) * 2 // 5 + np.array(PANEL, np.uint16) * 3 // 5).astype(np.uint8)
    for i, text in enumerate(lines):
        y = pad + line_h * (i + 1) - line_h // 4
        cv2.putText(out, text, (pad, y), font, scale, WHITE, thick, cv2.LINE_AA)

    # budget indicator, top right: a filled box, green within budget, red over it
    ok = result.status == "ok"  # the pipeline's verdict (edge.infer.latency), not one computed again here
    e2e = result.stage_ms.get("end_to_end")
    label = "{:.1f}/{:g} ms".format(e2e, budget_ms) if e2e is not None else "error"
    (tw, th), _ = cv2.getTextSize(label, font, scale, thick)
    bx0, by0 = max(0, w - tw - 3 * pad), 0
    cv2.rectangle(out, (bx0, by0), (w - 1, th + 3 * pad), GREEN if ok else RED, cv2.FILLED)
    cv2.putText(out, label, (bx0 + pad, th + pad + pad // 2), font, scale, WHITE, thick, cv2.LINE_AA)

    if not trained:  # the banner every untrained run carries
        (tw, th), _ = cv2.getTextSize(UNTRAINED_WARNING, font, scale * 0.8, thick)
        fit = min(1.0, (w - 2 * pad) / float(tw))
        s = scale * 0.8 * fit
        (tw, th), _ = cv2.getTextSize(UNTRAINED_WARNING, font, s, thick)
        cv2.rectangle(out, (0, h - th - 3 * pad), (w - 1, h - 1), AMBER, cv2.FILLED)
        cv2.putText(out, UNTRAINED_WARNING, (pad, h - pad - pad // 2), font, s, (0, 0, 0), thick, cv2.LINE_AA)
    return out


def stats_of(result: Result, budget_ms: float, fps: float) -> Dict[str, Any]:
    """The JSON-ready numbers the overlay shows (served at /stats.json)."""
    stats: Dict[str, Any] = {
        "frame": result.frame_id,
        "status": result.status,
        "fps": round(fps, 2),
        "budget_ms": budget_ms,
        "within_budget": result.status == "ok",
        "stage_ms": {k: round(v, 3) for k, v in result.stage_ms.items()},
        "top": [] if result.prediction is None else [{"label": lab, "score": round(s, 4)} for lab, s in
                                                     zip(result.prediction.labels, result.prediction.scores)],
        "size": [int(result.image.shape[1]), int(result.image.shape[0])],
        "error": result.error,
        "frames": result.frames,
        "misses": result.misses,
        "miss_rate": round(result.misses / result.frames, 5) if result.frames else 0.0,
    }
    return stats


MIN_TILE = (120, 160)  # px (height, width): the smallest a camera's tile gets, however small its frames


def mosaic(tiles: Dict[str, np.ndarray]) -> np.ndarray:
    """Several cameras' annotated frames as one image the size of the largest (a grid of tiles, each at least
    MIN_TILE): each frame scaled to fit its tile with its own aspect ratio, centred, and named."""
    cv2: Any = require("cv2")
    images = list(tiles.items())
    cols = int(np.ceil(np.sqrt(len(images))))
    rows = int(np.ceil(len(images) / cols))
    h = max(image.shape[0] for _, image in images)
    w = max(image.shape[1] for _, image in images)
    th, tw = max(MIN_TILE[0], h // rows), max(MIN_TILE[1], w // cols)
    out = np.zeros((th * rows, tw * cols, 3), np.uint8)
    for i, (name, image) in enumerate(images):
        y, x = (i // cols) * th, (i % cols) * tw
        ih, iw = image.shape[:2]
        fit = min(th / ih, tw / iw)
        sh, sw = max(1, min(th, int(ih * fit))), max(1, min(tw, int(iw * fit)))
        top, left = y + (th - sh) // 2, x + (tw - sw) // 2
        out[top:top + sh, left:left + sw] = cv2.resize(image, (sw, sh), interpolation=cv2.INTER_AREA)
        scale = max(0.4, th / 720.0)
        cv2.putText(out, name, (x + 8, y + th - 10), cv2.FONT_HERSHEY_SIMPLEX, scale, AMBER,
                    max(1, int(round(scale * 2))), cv2.LINE_AA)
    return out
