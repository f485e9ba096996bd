"""`edge doctor --as-service` on the systemd it finds: a setting that systemd does not know yet is left out
(JetPack 5's systemd 245 refuses ProtectProc=), and the transient unit has a runtime directory of its own (the
service's /run/jetson-edge is removed when a unit that names it stops)."""

import os

from edge.commands.doctor import sandbox_properties

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

