"""One Jetson install recipe per JetPack: the lines scripts/install_service.sh runs (its jetson_recipe function)
are the lines docs/service.md shows for each JetPack, in the same order, and the README's Jetson row names
them too. The recipe run for real with stand-in commands: a failed step stops the install with its message."""

import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "scripts" / "install_service.sh"
# JetPack -> (its constraints file, the apt suffix of its CUDA's nvcc)
JETPACKS = {"5": ("jetpack5", "11-4"), "6": ("jetpack6", "12-6"), "7": ("jetpack7", "13-0")}


def normalise(command: str, jetpack: str = "6") -> str:
    """The same command written in the docs or by the installer (step ...; $state for the state dir, $jp and $cuda
    for the JetPack's constraints and CUDA), without quotes."""
    jp, cuda = JETPACKS[jetpack]
    command = re.sub(r"^has_cuda_dev \|\| ", "", command.strip())
    command = re.sub(r"^(sudo|step|optional) ", "", command).replace("$(pycuda_source)", "pycuda")
    command = command.replace('"$state', "/var/lib/jetson-edge").replace("$jp", jp).replace("$cuda", cuda)
    return command.replace('"', "").replace("'", "")


def installer_recipe(jetpack: str = "6") -> List[str]:
    text = INSTALL.read_text(encoding="utf-8")
    body = re.search(r"^jetson_recipe\(\) \{\n(.*?)^\}", text, re.S | re.M)
    assert body is not None, "no jetson_recipe() in scripts/install_service.sh"
    return [normalise(line, jetpack) for line in body.group(1).splitlines()
            if re.search(r"(^|\| )(step|optional) ", line.strip())]


def test_recipe_is_the_jetpack_one() -> None:
    assert installer_recipe("6") == [
        "apt-get update",
        "apt-get install -y g++ python3-libnvinfer python3-opencv python3-venv python3-dev gstreamer1.0-tools",
        "apt-get install -y cuda-nvcc-12-6 cuda-cudart-dev-12-6 cuda-profiler-api-12-6 libcurand-dev-12-6",
        "python3 -m venv --system-site-packages .venv",
        "env PIP_CONSTRAINT=constraints/jetpack6.txt .venv/bin/python -m pip install --upgrade pip>=23.1",
        "env PATH=/usr/local/cuda/bin:$PATH PIP_CONSTRAINT=constraints/jetpack6.txt .venv/bin/pip install -e "
        ".[jetson,service,check]",
        "env PATH=/usr/local/cuda/bin:$PATH PIP_CONSTRAINT=constraints/jetpack6.txt .venv/bin/pip install -v pycuda",
        "env PATH=/usr/local/cuda/bin:$PATH .venv/bin/python scripts/build_kernel.py --into "
        "/var/lib/jetson-edge/kernels",
    ]
    assert not any("opencv-python" in line or "bootstrap" in line for line in installer_recipe())
    for jp, _ in JETPACKS.values():
        assert (ROOT / "constraints" / (jp + ".txt")).is_file()


@pytest.mark.parametrize("jetpack", sorted(JETPACKS))
def test_docs_show_the_installer_lines_in_order_for_each_jetpack(jetpack: str) -> None:
    text = (ROOT / "docs" / "service.md").read_text(encoding="utf-8")
    section = text[text.index("### What `install_service.sh` runs, per JetPack"):]
    section = section[section.index("#### JetPack " + jetpack):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    shown = [normalise(line, jetpack) for line in block.group(1).splitlines()]
    assert shown == installer_recipe(jetpack)


def test_the_day_one_install_runs_the_installer_once() -> None:
    """The docs' install block runs install_service.sh, which runs the recipe: not the recipe lines by hand first
    (they ran twice: pycuda and the kernel built twice)."""
    text = (ROOT / "docs" / "service.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- day-one: install -->\n```sh\n(.*?)```", text, re.S)
    assert block is not None
    lines = block.group(1).splitlines()
    assert sum("scripts/install_service.sh" in line for line in lines) == 1
    assert not set(installer_recipe("6")) & {normalise(line) for line in lines}


def test_readme_jetson_row_names_the_same_lines() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| Jetson"))
    named = [normalise(c) for c in re.findall(r"`([^`]+)`", row)]
    positions = [named.index(command) for command in installer_recipe("6")]
    assert positions == sorted(positions)


def stand_ins(tmp_path: Path) -> Dict[str, str]:
    """Commands the recipe runs, as scripts that log their arguments and fail when named in $FAIL_AT."""
    log = tmp_path / "ran.log"
    script = '#!/bin/sh\necho "$(basename "$0") $*" >> {log}\n' \
             'if [ "$(basename "$0")" = "$FAIL_AT" ]; then echo "E: $(basename "$0") broke" >&2; exit 100; fi\n' \
             'case "$*" in *"${{FAIL_ARGS:-@none@}}"*) echo "E: $(basename "$0") broke" >&2; exit 100;; esac\n'
    checkout = tmp_path / "checkout"
    for folder, names in ((tmp_path / "bin", ("apt-get", "python3")), (checkout / ".venv" / "bin",
                                                                       ("pip", "jtop", "python"))):
        folder.mkdir(parents=True)
        for name in names:
            path = folder / name
            path.write_text(script.format(log=log), encoding="utf-8")
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {"bin": str(tmp_path / "bin"), "checkout": str(checkout), "log": str(log)}


def run_recipe(tmp_path: Path, fail_at: str, fail_args: str = "", wheelhouse: str = "") -> subprocess.CompletedProcess:
    """jetson_recipe from the installer, sourced, as the installer runs it (a subshell in the checkout)."""
    paths = stand_ins(tmp_path)
    # This machine is no Jetson: name the JetPack and its CUDA; the CUDA parts are treated as missing.
    body = 'source "$1"; jetpack() { echo jetpack6; }; cuda_package_version() { echo 12-6; }; ' \
           'has_cuda_dev() { false; }; dry_run=0; state="$2"; wheelhouse="$4"; (cd "$3" && jetson_recipe) || exit 1; ' \
           'echo recipe done'
    env = dict(os.environ, PATH=paths["bin"] + os.pathsep + os.environ["PATH"], FAIL_AT=fail_at, FAIL_ARGS=fail_args)
    return subprocess.run(["bash", "-c", body, "recipe",
                           str(INSTALL), str(tmp_path / "state"), paths["checkout"], wheelhouse],
                          capture_output=True, encoding="utf-8", errors="replace", env=env, timeout=60)


@pytest.mark.parametrize("fail_at,ran", [
    ("apt-get", ["apt-get update"]),
    ("pip", ["apt-get", "apt-get", "apt-get", "python3", "python -m pip install --upgrade pip>=23.1",
             "pip install -e .[jetson,service,check]"]),
    ("python", ["apt-get", "apt-get", "apt-get", "python3", "python -m pip install --upgrade pip>=23.1"]),
])
def test_a_failed_step_stops_the_install_with_its_message(tmp_path: Path, fail_at: str, ran: List[str]) -> None:
    proc = run_recipe(tmp_path, fail_at)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "recipe done" not in proc.stdout
    assert "E: {} broke".format(fail_at) in proc.stderr
    assert re.search(r"step failed \(exit 100\): .*{}".format(re.escape(ran[-1].split()[0])), proc.stderr)
    logged = (tmp_path / "ran.log").read_text(encoding="utf-8").splitlines()
    assert [line.split()[0] for line in logged] == [r.split()[0] for r in ran]  # nothing after the failure ran
    assert logged[-1] == ran[-1]


def test_the_whole_recipe_runs_in_order_and_installs_nvcc_where_missing(tmp_path: Path) -> None:
    proc = run_recipe(tmp_path, fail_at="")
    assert proc.returncode == 0 and "recipe done" in proc.stdout, proc.stdout + proc.stderr
    assert (tmp_path / "ran.log").read_text(encoding="utf-8").splitlines() == [
        "apt-get update",
        "apt-get install -y g++ python3-libnvinfer python3-opencv python3-venv python3-dev gstreamer1.0-tools",
        "apt-get install -y cuda-nvcc-12-6 cuda-cudart-dev-12-6 cuda-profiler-api-12-6 libcurand-dev-12-6",
        "python3 -m venv --system-site-packages .venv",
        "python -m pip install --upgrade pip>=23.1",
        "pip install -e .[jetson,service,check]",
        "pip install -v pycuda",
        "python scripts/build_kernel.py --into {}/kernels".format(tmp_path / "state"),
    ]


def test_a_failed_pycuda_build_is_named_and_the_install_goes_on(tmp_path: Path) -> None:
    """pycuda compiles on the device (minutes) and may fail: the service runs without it (CPU preprocessing), so
    the recipe names the failure and its log, then builds the kernel and finishes."""
    proc = run_recipe(tmp_path, fail_at="", fail_args="install -v pycuda")
    assert proc.returncode == 0 and "recipe done" in proc.stdout, proc.stdout + proc.stderr
    assert re.search(r"optional step failed: .*pip install -v pycuda \(log: \S+\)", proc.stderr), proc.stderr
    assert "E: pip broke" in open(re.search(r"\(log: (\S+)\)", proc.stderr).group(1), encoding="utf-8").read()
    assert (tmp_path / "ran.log").read_text(encoding="utf-8").splitlines()[-2:] == [
        "pip install -v pycuda", "python scripts/build_kernel.py --into {}/kernels".format(tmp_path / "state")]


def test_a_wheelhouse_installs_its_checked_wheel_without_building(tmp_path: Path) -> None:
    house = tmp_path / "wheels"
    house.mkdir()
    (house / "pycuda-2025.1-cp310-cp310-linux_aarch64.whl").write_bytes(b"wheel")
    subprocess.run("sha256sum *.whl > SHA256SUMS", shell=True, cwd=str(house), check=True)
    proc = run_recipe(tmp_path, fail_at="", wheelhouse=str(house))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pip install -v --no-index --find-links {} pycuda".format(house) in (
        tmp_path / "ran.log").read_text(encoding="utf-8").splitlines()
    (house / "pycuda-2025.1-cp310-cp310-linux_aarch64.whl").write_bytes(b"swapped")
    proc = run_recipe(tmp_path / "again", fail_at="", wheelhouse=str(house))
    assert "SHA256SUMS does not match its wheels" in proc.stderr and "recipe done" in proc.stdout
    ran = (tmp_path / "again" / "ran.log").read_text(encoding="utf-8").splitlines()
    assert "pip install -v" in ran and not any("pycuda" in line for line in ran)  # pip refuses no requirement


def test_a_foreign_jtop_is_named_and_refused(tmp_path: Path) -> None:
    """A jtop outside the venv (an earlier `sudo pip3 install jetson-stats`) of another major.minor is named: the
    service runs the venv's (the drop-in), and that one's client would get "Mismatch version"; one of the same
    major.minor is not."""
    def jtop(path: Path, version: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('#!/bin/sh\necho "jtop {}"\n'.format(version), encoding="utf-8")
        path.chmod(0o755)
        return path

    jtop(tmp_path / "prefix" / ".venv" / "bin" / "jtop", "7.2.2")
    old, same = jtop(tmp_path / "local" / "jtop", "4.2.12"), jtop(tmp_path / "usr" / "jtop", "7.2.0")
    body = 'source "$1"; prefix="$2"; jtop_elsewhere=("$3" "$4" "$2/missing"); foreign_jtop'
    proc = subprocess.run(["bash", "-c", body, "foreign", str(INSTALL), str(tmp_path / "prefix"), str(old), str(same)],
                          capture_output=True, encoding="utf-8", errors="replace", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "install_service: warning: refusing {} (jetson-stats 4.2.12) for jtop.service: it runs the venv's jetson-stats "
        "7.2.2 instead, and {} cannot talk to that ('Mismatch version'): sudo pip3 uninstall jetson-stats".format(
            old, old)]
