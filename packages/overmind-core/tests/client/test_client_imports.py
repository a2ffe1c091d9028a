"""The client side stands apart from the server package, and the seal set is spelled once."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import overmind

SRC = os.path.dirname(overmind.__file__)


def test_the_client_and_the_launcher_do_not_import_the_server_package():
    code = ("import sys, overmind.client.connection, overmind.client.launcher, overmind.loading.flow\n"
            "print(sorted(m for m in sys.modules if m.startswith('overmind.server')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_seal_bits_are_named_only_in_shm_seals():
    spelled = []
    for folder, _, files in os.walk(SRC):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    if re.search(r"fcntl\.F_SEAL_(WRITE|GROW|SHRINK|SEAL)", f.read()):
                        spelled.append(os.path.relpath(path, SRC))
    assert spelled == [os.path.join("shm", "seals.py")]
