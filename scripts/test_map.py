#!/usr/bin/env python3
"""Print tests/README.md: each module of edge/ and the test files that import it, read from the file system.

    scripts/test_map.py > tests/README.md        # tests/test_test_map.py fails while the two differ

A module's own file (tests/test_<name>.py, or test_<room>_<name>.py) comes first, marked in bold; the others
follow, at most SHOWN in all, then how many more there are.
"""

import ast
import os
import sys
from typing import Dict, List, Set

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHOWN = 4  # test files named per module: the map stays one screen
HEADER = """# Tests, module by module

Each module of edge/ and the test files that import it: its own file first (**bold**), then others.
`pytest tests/FILE` runs one; README.md gives the command for all. tests/device/ needs a GPU (`-m jetson`:
pycuda and a CUDA device; `-m tensorrt`: TensorRT too). Written by scripts/test_map.py; tests/test_test_map.py
keeps it true.

| module | tests |
|---|---|"""


def edge_modules(repo: str) -> List[str]:
    """Dotted names of every module under edge/ (packages' __init__ and __main__ left out)."""
    found = []
    for folder, dirs, files in os.walk(os.path.join(repo, "edge")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, repo).replace(os.sep, ".")
        found += [rel + "." + f[:-3] for f in files if f.endswith(".py") and f not in ("__init__.py", "__main__.py")]
    return sorted(found)


def test_files(repo: str) -> List[str]:
    """tests/test_*.py and tests/device/test_*.py, relative to tests/."""
    tests = os.path.join(repo, "tests")
    found = []
    for sub in ("", "device"):
        folder = os.path.join(tests, sub)
        found += [os.path.join(sub, f) if sub else f for f in os.listdir(folder)
                  if f.startswith("test_") and f.endswith(".py")]
    return sorted(found)


def imported(path: str, modules: Set[str]) -> Set[str]:
    """The edge modules a file imports, anywhere in it (`from edge.x import y` counts y where y is a module)."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(node.module + "." + a.name for a in node.names)
    return names & modules


def own_names(module: str) -> Set[str]:
    """The test file names that are a module's own: test_<name>.py and test_<room>_<name>.py."""
    parts = module.split(".")
    names = {"test_{}.py".format(parts[-1])}
    if len(parts) > 2:
        names.add("test_{}_{}.py".format(parts[-2], parts[-1]))
    return names


def test_map(repo: str) -> Dict[str, List[str]]:
    """Module -> the test files importing it (or named for it), its own first."""
    modules = edge_modules(repo)
    users: Dict[str, Set[str]] = {m: set() for m in modules}
    for test in test_files(repo):
        for module in imported(os.path.join(repo, "tests", test), set(modules)):
            users[module].add(test)
    ordered = {}
    for module in modules:
        own = sorted(t for t in test_files(repo) if t in own_names(module))
        ordered[module] = own + sorted(users[module] - set(own))
    return ordered


def render(repo: str) -> str:
    rows = [HEADER]
    for module, tests in test_map(repo).items():
        own = own_names(module)
        shown = ["**{}**".format(t) if t in own else t for t in tests[:SHOWN]]
        if len(tests) > SHOWN:
            shown.append("+{} more".format(len(tests) - SHOWN))
        rows.append("| {} | {} |".format(module, ", ".join(shown) or "(through the commands)"))
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(REPO))
