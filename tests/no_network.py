"""Run code as on a machine without a network: connections to anything but this machine fail, as
an unplugged cable makes them fail, and nothing is cached from an earlier download."""

from __future__ import annotations

import errno
import re
import shlex
import socket
from pathlib import Path

_LOCAL = ("127.", "::1", "localhost", "0.0.0.0")


def _local(host: object) -> bool:
    return isinstance(host, str) and host.startswith(_LOCAL)


def refuse_network(monkeypatch, home: Path) -> None:
    """Refuse every non-loopback connection and name look-up in this process; torch's and the Hub's
    caches point into ``home`` (empty), so weights downloaded before cannot hide a download."""
    connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def refused_connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
            raise OSError(errno.ENETUNREACH, f"network unreachable (refused by the test): {address}")
        return connect(self, address)

    def refused_getaddrinfo(host, *args, **kwargs):
        if host is not None and not _local(host):
            raise socket.gaierror(socket.EAI_NONAME, f"no network (refused by the test): {host}")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", refused_connect)
    monkeypatch.setattr(socket, "getaddrinfo", refused_getaddrinfo)
    for variable in ("TORCH_HOME", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(variable, str(home / variable.lower()))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # offline because there is no network, not told to be


def documented_offline_command(script: Path) -> list[str]:
    """The arguments of the command ``script``'s docstring calls offline (the line ending in a
    comment that says "offline")."""
    lines = [line for line in script.read_text().split('"""')[1].splitlines() if re.search(r"#.*\boffline\b", line)]
    assert len(lines) == 1, f"{script.name}: expected one command documented as offline, got {lines}"
    words = shlex.split(lines[0].split("#")[0])
    return words[words.index(next(w for w in words if w.endswith(script.name))) + 1:]
