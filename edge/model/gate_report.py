"""What an engineer reads beside the gate's JSON report, and what the next build is judged on.

- `<artifact>.gate.md`: the verdict, the claims, failures, the tables per kind of image and per class (worst
  first), collapsed classes and the flipped images with their file names and logit margins. Every file name and
  label is data: escaped so that it stays text in one table cell (no HTML, no markup, no line break comes from a
  file).
- `export_flips`: the flipped images of a report, copied from its regression set (checked against the set hash the
  report records) into a new regression set whole or not at all: labelled images keep their class folder, as the
  gate read it (`<class index or label>/<file>`), so the next build is judged on them (`edge gate export-flips`).
"""

import os
import unicodedata
from typing import Any, Callable, Dict, List

from edge.errors import EdgeError
from edge.inputs import load_json
from edge.model.calibration import MANIFEST, SetWriter, load_calibration_set
from edge.model.gate_stats import percent
from edge.store.fileio import atomic_dir, atomic_write

CLASSES_SHOWN = 20  # per-class rows in the Markdown, worst first
HISTORY_SHOWN = 5  # the source model's last builds in the Markdown
HISTORY_HEAD = ["at", "candidate", "verdict", "labelled", "b", "c", "drop (pp)", "interval (pp)", "mean cosine",
                "p5 cosine", "classes changed", "collapsed"]
# Markdown markup that a backslash makes literal; <, > and & become entities so no HTML can start
_MARKUP = {c: "\\" + c for c in "\\`*_[]|~"}
_MARKUP.update({"<": "&lt;", ">": "&gt;", "&": "&amp;"})
_CONTROL = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")  # control, format, separators: shown as \uXXXX


def report_path(artifact: str) -> str:
    """The gate's JSON report of the artifact at `artifact` (the Markdown: `summary_path`)."""
    return os.path.splitext(artifact)[0] + ".gate.json"


def summary_path(report: str) -> str:
    return os.path.splitext(report)[0] + ".md"


def text(value: Any) -> str:
    """`value` as Markdown text that renders as itself on one line."""
    out = []
    for ch in "n/a" if value is None else str(value):
        if ch in _MARKUP:
            out.append(_MARKUP[ch])
        elif unicodedata.category(ch) in _CONTROL:
            out.append("\\u{:04x}".format(ord(ch)))
        else:
            out.append(ch)
    return "".join(out)


def _table(head: List[str], rows: List[List[Any]]) -> List[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(text(v) for v in row) + " |" for row in rows] + [""]


def _items(title: str, entries: List[Any]) -> List[str]:
    return ["## " + title, ""] + ["- " + text(e) for e in entries] + [""] if entries else []


def _classes(r: Dict[str, Any]) -> List[str]:
    rows = r.get("per_class") or []
    out = []
    if rows:
        out += ["## Per class (labelled images; worst {} of {} classes)".format(min(len(rows), CLASSES_SHOWN),
                                                                                 len(rows)), ""]
        out += _table(["class", "images", "FP32 right", "candidate right", "recall change (pp)"], [
            [c["class"], c["images"], c["reference_right"], c["candidate_right"],
             "{:+.1f}".format(100.0 * (c["candidate_right"] - c["reference_right"]) / max(c["images"], 1))]
            for c in rows[:CLASSES_SHOWN]])
    collapsed = r.get("collapsed_classes") or []
    if collapsed:
        out += ["## Collapsed classes (label-free, every image)", ""]
        out += _table(["class", "score spread ratio", "FP32 ranks it first", "out of the candidate's top-5"], [
            [c["class"], c["spread_ratio"], c["ranked_first"], c["left_top5"]] for c in collapsed])
    return out


def _strata(r: Dict[str, Any]) -> List[str]:
    rows = r.get("strata") or []
    if not rows:
        return []

    def shown(row: Dict[str, Any], key: str) -> Any:
        return "{:.1f} %".format(100.0 * row[key]) if key in row else None

    return ["## By kind of image ({}; drop interval at {})".format(text(r.get("strata_note")), percent(
        r.get("strata_confidence") or 0.975)), ""] + _table(
        ["kind", "images", "labelled", "changed top-1", "FP32 top-1", "candidate top-1", "drop (pp)", "interval (pp)"],
        [[row["stratum"], row["images"], row["labelled"], row["changed_top1"], shown(row, "reference_top1"),
          shown(row, "candidate_top1"), row.get("top1_drop_pp"), row.get("top1_drop_interval_pp")] for row in rows])


def _changed(classes: Any) -> str:
    """The first three classes of a history entry's `classes_changed`: 'name -2'."""
    out = []
    for c in (classes if isinstance(classes, list) else [])[:3]:
        if isinstance(c, dict) and isinstance(c.get("candidate_right"), int) and isinstance(c.get("reference_right"),
                                                                                         int):
            out.append("{} {:+d}".format(c.get("class"), c["candidate_right"] - c["reference_right"]))
    return ", ".join(out)


def history_table(history: List[Dict[str, Any]]) -> List[str]:
    """A source model's builds (edge.model.gate_looks' history) as a Markdown table, oldest first."""
    keys = ("at", "candidate", "verdict", "labelled", "right_to_wrong", "wrong_to_right", "top1_drop_pp",
            "top1_drop_interval_pp", "mean_cosine", "p5_cosine")
    return _table(HISTORY_HEAD, [[h.get(k) for k in keys] + [_changed(h.get("classes_changed")), h.get("collapsed")]
                                 for h in history])


def _history(r: Dict[str, Any]) -> List[str]:
    history = r.get("history") or []
    if len(history) < 2:
        return []
    return ["## This source model's last {} builds (b: right to wrong, c: wrong to right; `edge gate history`)"
            .format(len(history)), ""] + history_table(history)


def _flips(r: Dict[str, Any]) -> List[str]:
    flips = r.get("flips") or []
    not_listed = r.get("flips_not_listed") or 0
    out = ["## Flipped images ({}{})".format(len(flips) + not_listed, "; the first {} listed".format(len(flips))
                                            if not_listed else ""), ""]
    if not flips:
        return out + ["None: the candidate's top-1 is FP32's on every image.", ""]
    out.append("FP32 margin: FP32's logit lead of its answer over the candidate's; candidate margin: the reverse. "
               "Export them as a regression set: `edge gate export-flips OUT`.")
    return out + [""] + _table(["file", "label", "FP32", "candidate", "FP32 margin", "candidate margin", "cosine"], [
        [f.get("file"), f.get("label"), f.get("reference"), f.get("candidate"), f.get("reference_margin"),
         f.get("candidate_margin"), f.get("cosine")] for f in flips])


def markdown(r: Dict[str, Any]) -> str:
    """The report `r` (the gate's JSON report) as Markdown."""
    artifact = os.path.basename(str(r.get("artifact") or "candidate"))
    shown = [text(v) for v in (r.get("verdict"), percent(r.get("confidence") or 0.95), r.get("look", 1),
                               r.get("samples"), r.get("labelled"), r.get("regression_set"),
                               str(r.get("regression_sha256"))[:12])]
    lines = ["# Accuracy gate: " + text(artifact), "",
             "Verdict: **{}** at {} (look {}); {} images ({} labelled) of {} (set sha256 {}).".format(*shown),
             "", "Logit cosine: mean {}, 5th percentile {}; top-1 agreement {}.".format(
                 text(r.get("mean_cosine")), text(r.get("p5_cosine")), text(r.get("agreement"))), ""]
    lines += _items("Claims", r.get("claims") or [])
    lines += _items("Failures", r.get("failures") or [])
    lines += _items("Inconclusive", r.get("inconclusive") or [])
    lines += _items("Warnings", r.get("warnings") or [])
    cover = r.get("calibration_coverage") or {}
    if cover:
        lines += ["Calibration coverage: colour distance B, G, R {} grey levels between the calibration and the "
                  "regression set (warned above {}); mean levels {} and {}.".format(
                      *(text(v) for v in (cover.get("distance_levels"), cover.get("warn_levels"),
                                          (cover.get("mean_levels") or {}).get("calibration"),
                                          (cover.get("mean_levels") or {}).get("regression")))), ""]
    return "\n".join(lines + _strata(r) + _classes(r) + _history(r) + _flips(r))


def write_summary(path: str, report: Dict[str, Any]) -> None:
    """`markdown(report)` at `path`, whole or not at all."""
    data = markdown(report).encode("utf-8")
    atomic_write(path, lambda fh: fh.write(data), "gate summary")


def _read_report(path: str) -> Dict[str, Any]:
    if not os.path.isfile(path):
        raise EdgeError("{}: no gate report (build the model first: edge build; or name one with --report)".format(
            path))
    r = load_json(path, "gate report")
    if not (isinstance(r, dict) and isinstance(r.get("flips"), list) and isinstance(r.get("regression_set"), str)
            and all(isinstance(f, dict) and isinstance(f.get("file"), str) for f in r["flips"])):
        raise EdgeError("{}: not a gate report (no regression_set and flips with files)".format(path))
    return r


def export_flips(report_file: str, out_dir: str, log: Callable[..., None] = print) -> Dict[str, Any]:
    """The flipped images listed in the gate report `report_file` as a new regression set at `out_dir`; returns
    its manifest."""
    r = _read_report(report_file)
    names = sorted({f["file"] for f in r["flips"]})
    if not names:
        raise EdgeError("{}: the gate changed no top-1 answer: no flipped images to export".format(report_file))
    images = load_calibration_set(r["regression_set"], what="regression set")
    if images.sha256 != r.get("regression_sha256"):
        raise EdgeError("{}: changed since the gate report {} (set sha256 {}, the report's {}): rebuild to judge "
                        "this set".format(images.root, report_file, images.sha256[:12],
                                          str(r.get("regression_sha256"))[:12]))
    entries = {e["name"]: e for e in images.manifest["files"]}
    missing = [n for n in names if n not in entries]
    if missing:
        raise EdgeError("{}: the report's flipped image {} is not in the regression set {}".format(
            report_file, missing[0], images.root))
    with atomic_dir(out_dir, MANIFEST, "regression set", keep_out=images.root) as tmp:
        kept = SetWriter(tmp)
        for name in names:
            with open(images.path(name), "rb") as fh:
                data = fh.read()
            kept.add(name, data, (entries[name]["width"], entries[name]["height"]))
            if kept.hashes[name] != entries[name]["sha256"]:  # the temporary set goes with the error
                raise EdgeError("{}: changed since the gate report; nothing exported".format(images.path(name)))
        manifest = kept.finish("flips of " + os.path.abspath(report_file), {"from_set_sha256": images.sha256})
    labelled = sum("/" in n for n in names)
    log("export-flips: {} flipped images ({} labelled) from {} into {}{}; judge the next build on them with "
        "--regression {}".format(len(names), labelled, report_file, out_dir,
                                     " ({} flips the report does not list)".format(r["flips_not_listed"])
                                     if r.get("flips_not_listed") else "", out_dir))
    return manifest
