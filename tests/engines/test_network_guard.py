"""The engine tiers' network guard, checked without sending anything: the real connect is
replaced by a recorder, so a guard that let a connection through would show it here."""

from __future__ import annotations

import socket

import network_guard
import pytest


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    passed: list[object] = []
    monkeypatch.setitem(network_guard._ORIGINAL, "connect", lambda sock, address: passed.append(address))
    monkeypatch.setitem(network_guard._ORIGINAL, "getaddrinfo", lambda host, *a, **k: passed.append(host))
    monkeypatch.setattr(socket.socket, "connect", network_guard._connect)
    monkeypatch.setattr(socket, "getaddrinfo", network_guard._getaddrinfo)
    network_guard.take_attempts()
    return passed


@pytest.mark.parametrize("address", [("192.0.2.1", 443), ("2001:db8::1", 80, 0, 0), ("example.invalid", 80)])
def test_non_loopback_connect_is_refused_and_recorded(guarded: list[object], address: tuple[object, ...]) -> None:
    family = socket.AF_INET6 if ":" in str(address[0]) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(address)
    assert guarded == [] and len(network_guard.take_attempts()) == 1


@pytest.mark.parametrize("address", [("127.0.0.1", 9), ("localhost", 9)])
def test_loopback_connect_passes(guarded: list[object], address: tuple[object, ...]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.connect(address)
    assert guarded == [address] and network_guard.take_attempts() == []


def test_name_lookup_off_the_machine_is_refused(guarded: list[object]) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.getaddrinfo("huggingface.co", 443)
    assert guarded == [] and network_guard.take_attempts() == ["name lookup of 'huggingface.co'"]
