"""deploy/ansible/ansible.cfg as Ansible itself reads it (ansible-config, the installed ansible-core)."""

import os
import subprocess
import sys

import pytest
import service_helpers as sh

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = os.path.join(REPO, "deploy", "ansible", "ansible.cfg")


def effective(tmp_path, *args):
    """`ansible-config dump --only-changed` with the shipped file: the settings it changes, as Ansible parsed them."""
    tool = os.path.join(os.path.dirname(sys.executable), "ansible-config")
    if not os.path.exists(tool):
        pytest.skip("ansible-core not installed (pip install -e '.[fleet]')")
    proc = subprocess.run([tool, "dump", "--only-changed"] + list(args), capture_output=True, encoding="utf-8",
                          errors="replace", cwd=str(tmp_path), env=sh.ansible_env(tmp_path / "tmp", ANSIBLE_CONFIG=CFG))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_fleet_config_parses_with_forks_and_no_fact_gathering(tmp_path):
    out = effective(tmp_path)
    assert "DEFAULT_FORKS(" + CFG + ") = 50" in out, out
    assert "DEFAULT_GATHERING(" + CFG + ") = explicit" in out, out
    assert "DEFAULT_TIMEOUT(" + CFG + ") = 30" in out, out


def test_ssh_pipelines_and_keeps_one_connection_per_device_for_the_run(tmp_path):
    out = effective(tmp_path, "-t", "connection")
    ssh = out[out.index("\nssh:\n"):]
    assert "pipelining(" + CFG + ") = True" in ssh, ssh
    assert "ControlPersist=30m" in ssh and "ControlMaster=auto" in ssh, ssh
    assert "control_path(" + CFG + ") = %(directory)s/%%C" in ssh, ssh  # '%' formatting makes it %C, ssh's hash
