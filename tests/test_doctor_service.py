"""`edge doctor --as-service` on the systemd it finds: a setting that systemd does not know yet is left out
(JetPack 5's systemd 245 refuses ProtectProc=), and the transient unit has a runtime directory of its own (the
service's /run/jetson-edge is removed when a unit that names it stops); and whose OpenCV the doctor found."""

import importlib
import os
import sys

import pytest

from edge.cli.doctor import opencv_origin
from edge.cli.doctor_service import sandbox_properties

from conftest import REPO

UNIT = os.path.join(REPO, "systemd", "jetson-edge.service")


def test_settings_newer_than_this_systemd_are_left_out() -> None:
    old = sandbox_properties(UNIT, version=245)
    new = sandbox_properties(UNIT, version=252)
    assert "--property=ProtectProc=invisible" in new and not any("ProtectProc" in p for p in old)
    assert set(new) - set(old) == {"--property=ProtectProc=invisible"}


def test_the_transient_unit_has_its_own_runtime_directory() -> None:
    props = sandbox_properties(UNIT, version=252)
    assert "--property=RuntimeDirectory=jetson-edge-doctor" in props
    assert "--property=Environment=TMPDIR=/run/jetson-edge-doctor" in props
    assert not any(p.endswith("=jetson-edge") and "RuntimeDirectory" in p for p in props)
    assert "--property=StateDirectory=jetson-edge jetson-edge/engines" in props  # the kernel dir as the service



@pytest.mark.parametrize("path,origin", [
    ("/usr/lib/python3/dist-packages/cv2/__init__.py", "Ubuntu's python3-opencv"),
    ("/usr/lib/python3.10/dist-packages/cv2/__init__.py", "JetPack's libopencv-python"),
    ("/usr/local/lib/python3.10/dist-packages/cv2/__init__.py", "built or installed locally"),
])
def test_doctor_says_whose_opencv_it_is(path: str, origin: str) -> None:
    """JetPack has two: Ubuntu's python3-opencv (which the recipe installs) and NVIDIA's libopencv-python; the first
    on sys.path wins, and the doctor line says which."""
    assert opencv_origin(path) == origin


def test_a_venvs_pypi_opencv_is_named_as_such() -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running in a venv")
    assert opencv_origin(os.path.join(os.path.realpath(sys.prefix), "lib", "site-packages", "cv2",
                                      "__init__.py")) == "PyPI's, in this venv"


def test_doctor_names_a_jtop_service_its_client_cannot_talk_to(jtop_service, monkeypatch) -> None:
    """The real jtop service (testing mode): this venv's client talks to it; a client of another major.minor (a
    service left running /usr/local/bin/jtop of an older jetson-stats) gets jtop's own "Mismatch version" line."""
    from edge.cli.doctor import check_jtop

    status, _, detail = check_jtop()
    assert status == "ok" and "talks to it" in detail, detail
    monkeypatch.setattr(importlib.import_module("jtop.jtop"), "get_var", lambda regex: "4.3.1")
    status, _, detail = check_jtop()
    assert status == "warn" and "Mismatch version jtop service" in detail and "drop-in" in detail, detail
