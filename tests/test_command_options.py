"""Command options are declared once (edge.fields `setting(..., flag=...)`): argparse, the bounds check and a
caller building the options in code (the rebuild's job, its latency check) read the same declaration."""

import argparse

import numpy as np
import pytest
import yaml

from edge.bench import check
from edge.bench.check import RegressionOptions
from edge.bench.sweep_options import SweepOptions
from edge.cli import build, cache, classify, demo, doctor, export, gate, rebuild, release, run
from edge.cli import check as check_command
from edge.cli.main import build_parser
from edge.config import Config, load_config
from edge.fields import as_argv, leaves, options_from
from edge.model.capture_options import CaptureOptions
from edge.model.model_add_options import ModelAddOptions
from edge.model.rebuild_options import RebuildOptions

from conftest import assert_refused, edge_here

DECLARED = (Config, RegressionOptions, check.CheckOptions, demo.DemoOptions, RebuildOptions, CaptureOptions,
            SweepOptions, release.ReleaseOptions, build.BuildOptions, build.ArtifactOptions, build.ImportOptions,
            rebuild.ReloadOptions, export.ExportOptions, cache.CacheOptions, classify.ClassifyOptions,
            doctor.DoctorOptions, run.RunOptions, gate.ExportFlipsOptions, gate.HistoryOptions, ModelAddOptions)
# The option strings that are no setting: argparse's own (-h/--help, --version), and --config, which names the file
# the config's settings are read from (a setting cannot choose the file it is read from).
NOT_SETTINGS = {"-h", "--help", "--version", "--config"}


def _commands(parser, prefix=""):
    """(command name, its parser) of every subcommand, calibrate's included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, prefix + name + " ") if any(
                    isinstance(a, argparse._SubParsersAction) for a in sub._actions) else [(prefix + name, sub)]


def test_every_option_of_every_command_is_a_declared_setting():
    """A command writes add_argument by hand only for positionals and subcommands: every other option string (but
    NOT_SETTINGS) is a `setting`'s flag that edge.fields registered, with the declaration's key as its dest and no
    default of argparse's own."""
    declared = {}  # flag -> the keys declaring it
    for cls in DECLARED:
        for dotted, f, _ in leaves(cls):
            if f.metadata.get("flag"):
                declared.setdefault(f.metadata["flag"], set()).add(dotted)
    parser = build_parser()
    options = [(name, a) for name, p in [("edge", parser)] + list(_commands(parser)) for a in p._actions
               if a.option_strings and not set(a.option_strings) <= NOT_SETTINGS]
    assert len(options) > 100
    by_hand = ["{} {}".format(name, "/".join(a.option_strings)) for name, a in options
               if len(a.option_strings) != 1 or a.dest not in declared.get(a.option_strings[0], ()) or
               a.default is not None]
    assert by_hand == []


def test_a_numeric_option_with_a_default_is_a_declared_one():
    """A command's number with a default of its own (a second declaration beside the config's or the command's
    options) fails here: it must be a `setting` whose flag argparse got from edge.fields."""
    flags = {f.metadata["flag"] for cls in DECLARED for _, f, _ in leaves(cls) if f.metadata["flag"]}
    numeric = [(name, action) for name, parser in _commands(build_parser())
               for action in parser._actions if action.option_strings and action.type in (int, float)]
    assert len(numeric) > 20
    undeclared = [(name, a.option_strings[0]) for name, a in numeric
                  if a.default is not None and a.option_strings[0] not in flags]
    assert undeclared == []
    declared = [a for _, a in numeric if a.option_strings[0] in flags]
    assert declared and all(a.default is None for a in declared)  # the default is the declaration's, not argparse's


def test_every_option_of_edge_release_is_a_declared_one():
    """`edge release` writes add_argument only for its action and release name: each flag is a ReleaseOptions
    setting, with no default of argparse's own."""
    parser = dict(_commands(build_parser()))["release"]
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    declared = {dotted: f.metadata["flag"] for dotted, f, _ in leaves(release.ReleaseOptions)}
    assert sorted((a.dest, a.option_strings[0]) for a in options) == sorted(declared.items())
    assert all(a.default is None for a in options)
    assert release.ReleaseOptions().timeout_s == options_from(_parse(release.add_arguments, ["try", "r1"]),
                                                              release.ReleaseOptions).timeout_s


def _parse(add_arguments, argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([str(a) for a in argv])


def test_a_repeated_flag_and_a_switch_read_back_as_declared():
    """A list of texts is a repeated flag (`--add A --add B`), a switch is true only when given; nothing given is
    the declared default."""
    wanted = cache.CacheOptions(add=["model=m.onnx", "labels=m.txt"], digest="ab" * 32)
    argv = ["fetch", "c"] + as_argv(wanted)
    assert argv.count("--add") == 2
    assert options_from(_parse(cache.add_arguments, argv), cache.CacheOptions) == wanted
    assert options_from(_parse(cache.add_arguments, ["fetch", "c"]), cache.CacheOptions) == cache.CacheOptions()
    given = options_from(_parse(rebuild.add_arguments, ["--pid", 42, "--systemd", "--dry-run"]),
                         rebuild.ReloadOptions)
    assert given == rebuild.ReloadOptions(pid=42, systemd=True, dry_run=True)
    assert (given.unit, given.no_reload) == (rebuild.DEFAULT_UNIT, False)


def test_the_rebuild_job_built_in_code_is_the_one_the_command_line_gives():
    """RebuildJob() and `edge rebuild` with no option flags agree because both read RebuildOptions' declarations."""
    from edge.model.rebuild import RebuildJob

    args = _parse(rebuild.add_arguments, ["--no-reload"])
    assert {dotted for dotted, _, _ in leaves(RebuildOptions)} <= set(vars(args))  # every option has its flag
    job = rebuild.job_from_args(args, stamp="x")
    assert job == RebuildJob(load_config(None), stamp="x")
    assert job.options.capture_frames == 3000 and job.options.check_frames == 300
    given = rebuild.job_from_args(_parse(rebuild.add_arguments, ["--no-reload", "--capture-frames", 90,
                                                                  "--min-images", 3, "--check-warmup", 0]))
    assert (given.options.capture_frames, given.min_images, given.options.check_warmup) == (90, 3, 0)
    assert given.check_source == "synthetic"  # '': the configured source


def test_the_check_reads_back_exactly_the_options_its_callers_pass():
    """Options spelled as flags (as_argv) are read back unchanged by `edge check`'s parser, and no flag given is the
    declared default."""
    assert options_from(_parse(check_command.add_arguments, []), check.CheckOptions) == check.CheckOptions()
    wanted = check.CheckOptions(frames=7, warmup=0, json="r.json", plot="", regression_pct=2.5, regression_ms=0.0)
    assert options_from(_parse(check_command.add_arguments, as_argv(wanted)), check.CheckOptions) == wanted
    assert options_from(_parse(demo.add_arguments, []), demo.DemoOptions) == demo.DemoOptions()


def test_the_rebuild_spells_neither_the_checks_flags_nor_its_report_keys():
    """edge.bench.check owns the check's options (CheckOptions) and its report's keys (verdict)."""
    import ast

    import edge.model.rebuild

    with open(edge.model.rebuild.__file__, encoding="utf-8") as fh:
        strings = {n.value for n in ast.walk(ast.parse(fh.read())) if isinstance(n, ast.Constant)
                   and isinstance(n.value, str)}
    owned = {f.metadata["flag"] for _, f, _ in leaves(check.CheckOptions)} | set(check.VERDICT_KEYS) | {
        "stages_ms", "end_to_end", "check", "-m"}
    assert strings & owned == set()


def test_verdict_reads_a_report_or_names_the_file():
    report = {"verdict": "fail", "verdict_reason": "p99 over budget", "budget_ms": 5.0, "frames": 10, "misses": 3,
              "miss_rate": 0.3, "stages_ms": {"end_to_end": {"p50": 4.0, "p99": 9.0}}}
    found = check.verdict(report, "r.json")
    assert not found.passed and found.reason == "p99 over budget"
    assert found.summary == dict({k: report[k] for k in check.VERDICT_KEYS}, p50_ms=4.0, p99_ms=9.0)
    assert check.verdict(dict(report, verdict="pass"), "r.json").passed
    with pytest.raises(Exception, match="r.json: not a latency report"):
        check.verdict(dict(report, stages_ms={}), "r.json")


@pytest.mark.parametrize("argv, flag", [
    (["check", "--frames", 0], "--frames"),
    (["check", "--warmup", -1], "--warmup"),
    (["check", "--regression-ms", "inf"], "--regression-ms"),
    (["demo", "--port", 70000], "--port"),
    (["demo", "--jpeg-quality", 101], "--jpeg-quality"),
    (["demo", "--frames", -1], "--frames"),
    (["rebuild", "--no-reload", "--check-warmup", -1], "--check-warmup"),
    (["rebuild", "--no-reload", "--capture-frames", -5], "--capture-frames"),
    (["rebuild", "--no-reload", "--min-images", 0], "--min-images"),
    (["calibrate", "capture", "--every", 0], "--every"),
    (["calibrate", "capture", "--min-diff", 256], "--min-diff"),
    (["calibrate", "import", "src", "out", "--min-images", 0], "--min-images"),
])
def test_an_option_out_of_its_bounds_is_one_line_naming_the_flag(argv, flag):
    assert_refused(edge_here(*argv), "error: " + flag, "must be between")


def test_calibrate_import_obeys_build_min_images(tmp_path):
    cv2 = pytest.importorskip("cv2")
    src, out = tmp_path / "src", tmp_path / "set"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        cv2.imwrite(str(src / "{}.png".format(i)), rng.integers(0, 255, (48, 48, 3), dtype=np.uint8))
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump({"build": {"min_images": 4}}), encoding="utf-8")
    assert_refused(edge_here("calibrate", "import", src, out, "--config", config), "at least 4 needed",
                   "build.min_images")
    assert not out.exists()
    assert edge_here("calibrate", "import", src, out, "--config", config, "--min-images", 3).returncode == 0
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".png") == ["0.png", "1.png", "2.png"]
