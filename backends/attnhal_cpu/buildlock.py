"""An exclusive lock on a file that the operating system releases when its holder dies.

``flock`` locks belong to an open file description: when the holding process exits for
any reason (SIGKILL and the OOM killer included) the kernel closes its descriptors and the
lock is free, so a lock file left behind blocks no one. The file itself stays (deleting a
lock file others may have open is racy); the holder writes its pid, host and start time
into it for waiters to quote. Descriptors Python opens are not inherited across ``exec``,
so a compiler started while the lock is held does not hold it too.

Linux and macOS only (``fcntl``); :func:`supported` says whether this platform has it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from attnhal.errors import AttnhalError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LockTimeout", "exclusive", "holder", "supported"]

POLL_S = 0.2


class LockTimeout(AttnhalError, TimeoutError):
    """The lock stayed taken past the bound (the message names the lock file and its holder)."""


def supported() -> bool:
    return fcntl is not None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _describe(text: str) -> str:
    try:
        record = json.loads(text)
        return f"pid {record['pid']} on host {record['host']} since {record['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its pid yet"


def holder(path: Path) -> str | None:
    """Who holds the lock at ``path`` now (``pid N on host H since T``), or None when it is free."""
    if fcntl is None or not path.exists():
        return None
    fd = os.open(path, os.O_RDWR)
    try:
        if _try_lock(fd):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return _describe(path.read_text(errors="replace"))
    finally:
        os.close(fd)


@contextmanager
def exclusive(path: Path, timeout: float, on_wait: Callable[[str, float], None],
              every: float = 10.0) -> Iterator[None]:
    """Hold the lock at ``path`` (created if missing) for the ``with`` body.

    While it is taken, ``on_wait(holder, seconds_waited)`` is called at once and then every
    ``every`` seconds; after ``timeout`` seconds :class:`LockTimeout` is raised.
    """
    if fcntl is None:
        raise OSError("flock is not available on this platform")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start, said = time.monotonic(), -every
        while not _try_lock(fd):
            waited = time.monotonic() - start
            if waited >= timeout:
                raise LockTimeout(f"waited {waited:.0f} s for the build lock {path}, "
                                  f"held by {_describe(path.read_text(errors='replace'))}")
            if waited - said >= every:
                said = waited
                on_wait(_describe(path.read_text(errors="replace")), waited)
            time.sleep(POLL_S)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": stamp}).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
