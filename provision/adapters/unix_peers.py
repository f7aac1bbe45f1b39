"""Which Unix socket is connected to which: the kernel's sock_diag, asked over netlink.

The render server hands each worker one end of a socket pair and QEMU the other (a render
context). The two ends' inode numbers are paired only in the kernel, so the watch asks it:
``peers()`` maps every connected Unix socket inode in this network namespace to its
peer's inode. Once one end of a pair is closed, the kernel drops that end from the dump
and reports the other end's peer as 0: "the other end is gone" is read off the kernel, not
guessed from which processes were seen. No privileges are needed (it is what ``ss -x``
reads). ``open_sockets(pid)`` reads which socket inodes a process holds from ``/proc/PID/fd``.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_PEER = 0x4
UNIX_DIAG_PEER = 2
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQ = struct.Struct("=BBHIII8x")  # family, protocol, pad, states, ino, show, cookie
_MSG = struct.Struct("=BBBBI8x")  # family, type, state, pad, ino, cookie
_ATTR = struct.Struct("=HH")


def _align(n: int) -> int:
    return (n + 3) & ~3


def parse(data: bytes, peers: dict[int, int], sock_type: int | None = None) -> bool:
    """Add the (inode -> peer) pairs of one netlink reply to ``peers``; True at the dump's end.

    With ``sock_type`` (``socket.SOCK_SEQPACKET``, …) only sockets of that type are added.

    Every read stays inside both the reply and its message: a short or lying reply is read
    as far as it goes.
    """
    off = 0
    while off + _NLMSG.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
        if kind == NLMSG_DONE:
            return True
        end = min(off + length, len(data))
        body = off + _NLMSG.size
        if kind == NLMSG_ERROR:
            if body + 4 > end:
                raise OSError(0, "sock_diag: a short error reply")
            code = -struct.unpack_from("=i", data, body)[0]
            raise OSError(code, f"sock_diag: {os.strerror(code)}")
        if length < _NLMSG.size:
            break  # a message that claims no room for itself: nothing after it can be trusted
        if body + _MSG.size <= end:
            _fam, its_type, _state, _pad, ino = _MSG.unpack_from(data, body)
            attr = body + _MSG.size
            while attr + _ATTR.size <= end and (sock_type is None or its_type == sock_type):
                alen, atype = _ATTR.unpack_from(data, attr)
                if alen < _ATTR.size or attr + alen > end:
                    break
                if atype == UNIX_DIAG_PEER and alen >= _ATTR.size + 4:
                    peers[ino] = struct.unpack_from("=I", data, attr + _ATTR.size)[0]
                attr += _align(alen)
        off += _align(length)
    return False


def peers(sock_type: int | None = None) -> dict[int, int]:
    """inode -> peer inode (0: closed) of every connected Unix socket the kernel reports; OSError if it cannot."""
    found: dict[int, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(5.0)
        req = _REQ.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, UDIAG_SHOW_PEER)
        nl.sendto(_NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + req,
                  (0, 0))
        while not parse(nl.recv(1 << 16), found, sock_type):
            pass
    return found


def open_sockets(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """Socket inodes ``pid`` holds open (empty when it is gone or not ours to read)."""
    found: set[int] = set()
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue  # closed between the listing and the read
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found
