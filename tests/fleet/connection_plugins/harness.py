"""Ansible connection plugin of the fleet harness (tests/fleet/harness.py): runs on this machine like `local`, in
the host's root folder (ansible_host), and behaves like an SSH connection that drops: while <root>/OFFLINE exists
the host is unreachable, and a command running when it appears loses its connection (killed, like the SSH
session's processes; what the device started in units of its own keeps running)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.connection.local import Connection as LocalConnection

DOCUMENTATION = """
    name: harness
    short_description: a local host of the fleet harness that can drop off the network
    description:
        - Runs like the local connection; unreachable while <ansible_host>/OFFLINE exists.
    author: jetson-edge
    extends_documentation_fragment:
        - connection_pipelining
"""


class Connection(LocalConnection):
    transport = "harness"

    def _offline(self) -> bool:
        return os.path.exists(os.path.join(self._play_context.remote_addr, "OFFLINE"))

    def _connect(self):
        if self._offline():
            raise AnsibleConnectionFailure("harness: {} is offline".format(self._play_context.remote_addr))
        return super()._connect()

    def exec_command(self, cmd, in_data=None, sudoable=True):
        self._connect()
        proc = subprocess.Popen(cmd, shell=True, executable="/bin/sh", stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        out = []
        talk = threading.Thread(target=lambda: out.extend(proc.communicate(in_data)))
        talk.start()
        while talk.is_alive():
            talk.join(0.1)
            if talk.is_alive() and self._offline():
                os.killpg(proc.pid, signal.SIGKILL)
                talk.join()
                raise AnsibleConnectionFailure("harness: connection to {} lost".format(
                    self._play_context.remote_addr))
        if self._offline():  # the answer is lost with the connection
            raise AnsibleConnectionFailure("harness: connection to {} lost".format(self._play_context.remote_addr))
        return proc.returncode, out[0], out[1]

    def put_file(self, in_path, out_path):
        self._connect()
        return super().put_file(in_path, out_path)

    def fetch_file(self, in_path, out_path):
        self._connect()
        return super().fetch_file(in_path, out_path)
