"""edge.cli.main: every command module of edge/cli/ is registered, and `edge COMMAND` runs through the one error
path (exit 0, or one error line and its exit code)."""

import importlib
import os

from edge.cli import main as cli


def test_every_command_module_is_a_registered_command():
    folder = os.path.dirname(os.path.abspath(cli.__file__))
    modules = [importlib.import_module("edge.cli." + name[:-3]) for name in os.listdir(folder) if name.endswith(".py")]
    commands = {module.__name__.rsplit(".", 1)[1] for module in modules if hasattr(module, "register")}
    assert set(cli.COMMANDS) == commands  # a module with a register() left out would be unreachable
    choices = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    assert set(cli.COMMANDS) <= set(choices)  # each registers itself (and may add more: `edge calibrate`)


def test_a_command_runs_and_its_failure_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["init", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("edge init: ")
    assert cli.main(["init", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edge init: error: {} already has ".format(tmp_path)) and err.count("\n") == 1
