"""Static checks CI runs with the tests: Python 3.8 compatibility (no 3.8 interpreter here), lint, the list of
tests whose premise could differ between machines (tests/premises.py), one definition of each shared test helper,
and the schedule's file names."""

import ast
import glob
import os
import subprocess
import sys

import premises
from conftest import HERE, REPO, schedule_problems


def test_source_is_python38_compatible():
    vermin = os.path.join(os.path.dirname(sys.executable), "vermin")
    proc = subprocess.run([vermin, "--target=3.8-", "--violations", "--no-tips", "--eval-annotations",
                           "edge", "scripts", "benchmarks"], cwd=REPO, capture_output=True,
                           encoding="utf-8", errors="replace")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "edge", "tests", "scripts", "benchmarks"],
                          cwd=REPO, capture_output=True, encoding="utf-8", errors="replace")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _tests_by_kind():
    """FILE::TEST of every test that uses a trained model (a fixture of TRAINED_FIXTURES), runs as another user
    (calls as_nobody, or says nobody/unprivileged in its name) or shares the jtop socket (WORKER_FIXTURES)."""
    found = {kind: set() for kind in premises.KINDS}
    for path in sorted(glob.glob(os.path.join(REPO, "tests", "test_*.py"))):
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            key = "{}::{}".format(os.path.basename(path), node.name)
            params = {a.arg for a in node.args.args}
            calls = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
            if params & TRAINED_FIXTURES:
                found["TRAINED"].add(key)
            if "as_nobody" in calls or "nobody" in node.name or "unprivileged" in node.name:
                found["USER"].add(key)
            if params & WORKER_FIXTURES:
                found["WORKERS"].add(key)
    return found


TRAINED_FIXTURES = {"digits", "digits_qdq", "effnet", "int8", "labelled"}
WORKER_FIXTURES = {"jtop_service", "no_jtop_service"}


def test_every_test_with_a_machine_dependent_premise_says_how_it_holds_everywhere():
    for kind, tests in _tests_by_kind().items():
        listed = premises.KINDS[kind]
        missing = [t for t in sorted(tests) if t not in listed and t.split("::")[0] + "::*" not in listed]
        assert not missing, "tests/premises.py {}: say how each premise holds on any machine: {}".format(kind, missing)
        files = {t.split("::")[0] for t in tests}
        stale = [k for k in listed if k not in tests and not (k.endswith("::*") and k.split("::")[0] in files)]
        assert not stale, "tests/premises.py {}: no such test of that kind: {}".format(kind, stale)


def test_a_schedule_naming_a_missing_or_repeated_file_is_refused():
    assert schedule_problems(("test_static.py", "test_gone.py", "test_static.py")) == [
        "test_static.py is listed twice", "test_gone.py is no file in " + HERE]


SHARED_HELPERS = ("conftest.py", "service_helpers.py", "store_helpers.py")


def _defined(path, top_level_only):
    tree = ast.parse(open(path, encoding="utf-8").read())
    nodes = tree.body if top_level_only else ast.walk(tree)
    return {n.name.lstrip("_") for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_shared_helpers_are_defined_once():
    """A test file that defines its own free_port, json_lines, write_config, wait_until ... (or _free_port) has a
    second copy of a helper that tests/conftest.py or tests/service_helpers.py owns: import that one."""
    shared = {name: module for module in SHARED_HELPERS for name in _defined(os.path.join(HERE, module), True)
              if not name.startswith("pytest_")}  # hooks: each conftest.py has its own
    again = ["{} defines {} ({} has it)".format(os.path.relpath(path, HERE), name, shared[name])
             for path in sorted(glob.glob(os.path.join(HERE, "**", "*.py"), recursive=True))
             if os.path.basename(path) not in SHARED_HELPERS
             for name in sorted(_defined(path, False) & set(shared))]
    assert not again, again


TEXT_FLAGS = ("text", "universal_newlines")


def _unnamed_encodings(path):
    """Lines of `path` that read or write text in the locale's encoding: open() in a text mode, read_text(),
    write_text(data) or a subprocess with text=True, none naming encoding=."""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if not isinstance(node, ast.Call) or any(k.arg == "encoding" for k in node.keywords):
            continue
        flags = {k.arg: k.value for k in node.keywords}
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        mode = node.args[1] if len(node.args) > 1 else flags.get("mode", ast.Constant("r"))
        if (any(isinstance(flags.get(f), ast.Constant) and flags[f].value is True for f in TEXT_FLAGS)
                or (isinstance(node.func, ast.Name) and name == "open" and "b" not in str(getattr(mode, "value", "")))
                or (isinstance(node.func, ast.Attribute) and (name, len(node.args)) in (("read_text", 0),
                                                                                         ("write_text", 1)))):
            found.append("{}:{}".format(os.path.relpath(path, REPO), node.lineno))
    return found


def test_text_io_names_its_encoding():
    """CI once ran in a worker whose locale encoding was ASCII: `systemd-analyze`'s UTF-8 output failed to decode.
    Text read or written by the product, its scripts and its tests names encoding="utf-8" (tools' output with
    errors="replace"), so no result depends on the machine's locale."""
    files = [os.path.join(REPO, "setup.py")] + [p for folder in ("edge", "scripts", "benchmarks", "tests")
                                                for p in glob.glob(os.path.join(REPO, folder, "**", "*.py"),
                                                                   recursive=True)]
    unnamed = [line for path in sorted(files) for line in _unnamed_encodings(path)]
    assert not unnamed, "name encoding=\"utf-8\" (and errors=\"replace\" for a tool's output): {}".format(unnamed)


FLOORS = ("cli", "fleet", "model", "bench", "service", "sources", "infer", "store")  # then base: edge/*.py


def _floor(module: str) -> int:
    """A module's floor, 0 the top: edge.<room>.x is its room's, edge.x (and edge itself) the base's."""
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else len(FLOORS)


def upward_imports(root: str):
    """(importer, imported) of every import in `root`'s edge/ that reaches a floor above the importer's."""
    found = []
    for path in sorted(glob.glob(os.path.join(root, "edge", "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
        module = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
        if module == "edge.__main__":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "edge":
                names = [node.module + "." + a.name for a in node.names] if node.module.count(".") < 1 or (
                    node.module.count(".") == 1 and node.module.split(".")[1] in FLOORS) else [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == "edge"]
            else:
                continue
            found += [(module, name) for name in names if _floor(name) < _floor(module)]
    return found


def test_imports_go_down_the_floors_only(tmp_path):
    assert upward_imports(REPO) == []
    rooms = {d for _, dirs, _ in os.walk(os.path.join(REPO, "edge")) for d in dirs} - {"__pycache__", "cuda"}
    assert rooms == set(FLOORS)  # and no folder named build/, which tools read as output
    planted = tmp_path / "edge" / "store"
    planted.mkdir(parents=True)
    (planted / "versions.py").write_text("from edge.service.runtime import Runtime\nfrom edge import board\n",
                                         encoding="utf-8")
    (tmp_path / "edge" / "config.py").write_text("from edge.store import fileio\n", encoding="utf-8")
    assert sorted(upward_imports(str(tmp_path))) == [("edge.config", "edge.store.fileio"),
                                                     ("edge.store.versions", "edge.service.runtime")]
