"""edge.model.steps: the build chain's one wrapper runs named steps over one state; a failure of any kind is one
StepFailed line naming the step, after the undo actions of the steps before (newest first), and staged files are
removed whatever happens."""

import os
import types

import pytest

from edge.errors import EXIT_FAIL
from edge.model.steps import EXIT_INTERRUPTED, BuildState, Step, StepFailed, run_steps


def chain(tmp_path, failure):
    """stage (writes a staged file) -> install (commit: registers two undo actions) -> gate (raises `failure`)."""
    done, artifact = [], str(tmp_path / "engines" / "m.int8.onnx")

    def stage(plan, state, log):
        with open(state.stage(artifact), "wb") as fh:
            fh.write(b"candidate")

    def install(plan, state, log):
        state.undo.append(("the previous labels restored", lambda: done.append("labels")))
        state.undo.append(("the previous model restored", lambda: done.append("model")))

    def gate(plan, state, log):
        if failure is not None:
            raise failure

    steps = [Step("stage", stage), Step("install", install, commit=True), Step("gate", gate)]
    return steps, types.SimpleNamespace(artifact=artifact), done


@pytest.mark.parametrize("failure,why,code", [
    (OSError(28, "No space left on device", "/engines/x"), "No space left on device (/engines/x)", EXIT_FAIL),
    (KeyboardInterrupt(), "interrupted", EXIT_INTERRUPTED),
    (ValueError("odd"), "ValueError: odd", EXIT_FAIL)])
def test_a_failed_step_is_one_line_naming_it_after_the_undo_of_the_steps_before(tmp_path, failure, why, code):
    steps, plan, done = chain(tmp_path, failure)
    state, lines, cleaned = BuildState("m.onnx"), [], []
    with pytest.raises(StepFailed) as err:
        run_steps(steps, plan, state, lines.append, chain="rebuild", cleanup=cleaned.append)
    assert str(err.value) == ("rebuild failed at step 'gate': {}; the previous labels restored, the previous model "
                              "restored, {} unchanged".format(why, plan.artifact))
    assert err.value.exit_code == code and done == ["model", "labels"]  # newest first
    assert cleaned == [True] and not any(os.path.exists(path) for path in state.staged)
    assert [line.split(" done in")[0] for line in lines] == ["rebuild: step 1/3 'stage'", "rebuild: step 2/3 'install'"]


def test_a_chain_that_passes_logs_each_step_keeps_its_undo_unrun_and_removes_what_it_staged(tmp_path):
    steps, plan, done = chain(tmp_path, None)
    state, lines, cleaned = BuildState("m.onnx"), [], []
    run_steps(steps, plan, state, lines.append, cleanup=cleaned.append)
    assert len(lines) == 3 and lines[-1].startswith("build: step 3/3 'gate' done in ")
    assert cleaned == [False] and done == [] and len(state.staged) == 1 and not os.path.exists(state.staged[0])
