"""tests/README.md is the module -> test map that scripts/test_map.py prints from the file system: a module or test
file added, moved or removed without regenerating it fails here."""

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _test_map():
    spec = importlib.util.spec_from_file_location("test_map", os.path.join(REPO, "scripts", "test_map.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_the_scripts_map():
    with open(os.path.join(REPO, "tests", "README.md"), encoding="utf-8") as fh:
        written = fh.read()
    assert written == _test_map().render(REPO), "regenerate: scripts/test_map.py > tests/README.md"


def test_the_map_names_every_module_and_who_imports_it(tmp_path):
    for folder in ("edge/store", "tests/device"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "edge" / "store" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "edge" / "store" / "versions.py").write_text("", encoding="utf-8")
    (tmp_path / "edge" / "uri.py").write_text("", encoding="utf-8")
    (tmp_path / "tests" / "test_versions.py").write_text("from edge.store import versions\n", encoding="utf-8")
    (tmp_path / "tests" / "test_crash.py").write_text("def test():\n    import edge.store.versions\n",
                                                      encoding="utf-8")
    (tmp_path / "tests" / "device" / "test_gpu.py").write_text("from edge.store.versions import x\n",
                                                              encoding="utf-8")
    rows = _test_map().render(str(tmp_path)).splitlines()[-2:]
    assert rows == ["| edge.store.versions | **test_versions.py**, device/test_gpu.py, test_crash.py |",
                    "| edge.uri | (through the commands) |"]
