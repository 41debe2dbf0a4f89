"""No test of the engine tiers reaches the network: any non-loopback connection is refused and fails the test.

Engines probe the network on their own (FlashInfer asks an artifact server whether cubins
exist; hub clients resolve model names). Installed at the tier's conftest import, so module
imports during collection are guarded too; an attempt raises ``ConnectionRefusedError``
where it is made and is recorded, so a test whose code swallowed the error still fails.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

ATTEMPTS: list[str] = []
_ORIGINAL = {"connect": socket.socket.connect, "connect_ex": socket.socket.connect_ex,
             "getaddrinfo": socket.getaddrinfo}


def _loopback(host: Any) -> bool:
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _target(address: Any) -> Any:
    return address[0] if isinstance(address, tuple) else address


def _refuse(what: str) -> None:
    ATTEMPTS.append(what)
    raise ConnectionRefusedError(f"network access refused in the engine tier: {what}")


def _connect(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(_target(address)):
        _refuse(f"connect to {address!r}")
    return _ORIGINAL["connect"](self, address)


def _connect_ex(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(_target(address)):
        _refuse(f"connect_ex to {address!r}")
    return _ORIGINAL["connect_ex"](self, address)


def _getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if not _loopback(host):
        _refuse(f"name lookup of {host!r}")
    return _ORIGINAL["getaddrinfo"](host, *args, **kwargs)


def install() -> None:
    socket.socket.connect = _connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = _getaddrinfo


def take_attempts() -> list[str]:
    """The refused attempts since the last call (and forget them)."""
    found = list(ATTEMPTS)
    ATTEMPTS.clear()
    return found
