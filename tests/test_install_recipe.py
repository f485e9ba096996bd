"""One Jetson install recipe: the lines scripts/install_service.sh runs (its jetson_recipe function) are the
lines docs/service.md shows, in the same order, and the README's Jetson install row names them too."""

import re
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent.parent


def normalise(command: str) -> str:
    """The same command written by hand (sudo ...) or by the installer (act ...; $state for the state dir)."""
    command = re.sub(r"^(sudo|act) ", "", command.strip())
    return command.replace('"$state', "/var/lib/jetson-edge").replace('"', "")


def installer_recipe() -> List[str]:
    text = (ROOT / "scripts" / "install_service.sh").read_text()
    body = re.search(r"^jetson_recipe\(\) \{\n(.*?)^\}", text, re.S | re.M)
    assert body is not None, "no jetson_recipe() in scripts/install_service.sh"
    return [normalise(line) for line in body.group(1).splitlines() if line.strip()]


def test_recipe_is_the_jetpack_one() -> None:
    recipe = installer_recipe()
    assert recipe == [
        "apt-get install -y python3-libnvinfer python3-opencv python3-venv python3-dev",
        "python3 -m venv --system-site-packages .venv",
        "env PATH=/usr/local/cuda/bin:$PATH .venv/bin/pip install -e '.[jetson,service,check]'",
        ".venv/bin/python scripts/build_kernel.py --into /var/lib/jetson-edge/kernels",
    ]
    assert not any("opencv-python" in line or "bootstrap" in line for line in recipe)


def test_docs_show_the_installer_lines_in_order() -> None:
    text = (ROOT / "docs" / "service.md").read_text()
    section = text[text.index("## Installing on a Jetson"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    shown = [normalise(line.split("  #")[0]) for line in block.group(1).splitlines()]
    recipe = installer_recipe()
    start = shown.index(recipe[0])
    assert shown[start:start + len(recipe)] == recipe
    assert "bootstrap.sh" not in block.group(1)


def test_readme_jetson_row_names_the_same_lines() -> None:
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| Jetson"))
    named = [normalise(c) for c in re.findall(r"`([^`]+)`", row)]
    recipe = installer_recipe()
    positions = [named.index(command) for command in recipe]
    assert positions == sorted(positions)
