"""systemd's notify protocol (``Type=notify``, ``WatchdogSec=``) over ``$NOTIFY_SOCKET``.

A datagram of ``KEY=value`` lines to the socket systemd names; the stdlib
``socket`` module is all it takes (see sd_notify(3)). Outside systemd the
variable is unset and every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def notify(*lines: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``READY=1``, ``STOPPING=1``, ``WATCHDOG=1``, ``STATUS=...``.

    False outside systemd, or when the message could not be sent at once.
    Never blocks: it is called from the event loop, and a unix datagram send
    to a receiver whose queue is full (``net.unix.max_dgram_qlen``, 10 by
    default) would otherwise stall the whole service.
    """
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.setblocking(False)
        try:
            sock.connect(address)
            sock.send("\n".join(lines).encode())
        except OSError:  # full queue (BlockingIOError), socket gone, refused
            return False
    return True


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """How often systemd expects ``WATCHDOG=1`` (half its timeout), or None without a watchdog."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None  # the watchdog is meant for another process (e.g. our parent)
    return int(usec) / 1_000_000 / 2
