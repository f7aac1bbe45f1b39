"""Which Unix socket is whose peer, from the kernel (sock_diag), and hostile netlink replies."""

from __future__ import annotations

import errno
import os
import socket
import struct

import pytest

from provision.adapters import unix_peers


def test_a_socket_pair_is_paired_both_ways_and_seen_in_our_fds() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        ia, ib = os.fstat(a.fileno()).st_ino, os.fstat(b.fileno()).st_ino
        pairs = unix_peers.peers()
        assert pairs[ia] == ib and pairs[ib] == ia
        assert {ia, ib} <= unix_peers.open_sockets(os.getpid())
    finally:
        a.close()
        b.close()
    assert ia not in unix_peers.open_sockets(os.getpid())


def test_once_one_end_is_closed_the_kernel_reports_the_other_ends_peer_as_0() -> None:
    # What the worker watch judges a death by: read off the kernel, whoever closed the end.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        ia, ib = os.fstat(a.fileno()).st_ino, os.fstat(b.fileno()).st_ino
        ic = os.fstat(c.fileno()).st_ino
        seqpacket = unix_peers.peers(socket.SOCK_SEQPACKET)
        assert seqpacket[ia] == ib and ic not in seqpacket and unix_peers.peers()[ic]  # the type filter
        b.close()
        after = unix_peers.peers(socket.SOCK_SEQPACKET)
        assert after[ia] == 0 and ib not in after
    finally:
        for s in (a, b, c, d):
            s.close()


def test_a_process_that_is_gone_holds_no_sockets() -> None:
    assert unix_peers.open_sockets(2**22 + 12345) == set()


def _msg(kind: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 1, 0) + body


def test_a_netlink_error_reply_is_an_oserror_with_its_errno() -> None:
    with pytest.raises(OSError) as info:
        unix_peers.parse(_msg(unix_peers.NLMSG_ERROR, struct.pack("=i", -errno.EPERM) + b"\0" * 16), {})
    assert info.value.errno == errno.EPERM


@pytest.mark.parametrize(
    "data",
    [
        b"",  # nothing
        b"\x10\x00",  # a header cut short
        _msg(20, struct.pack("=BBBBI8x", 1, 5, 1, 0, 77) + struct.pack("=HH", 2, 2)),  # attribute length below 4
        _msg(20, struct.pack("=BBBBI8x", 1, 5, 1, 0, 77) + struct.pack("=HHI", 8, 2, 78))[:-2],  # value cut short
        struct.pack("=IHHII", 0, 20, 0, 1, 0) + b"\0" * 16,  # a message claiming length 0
    ],
)
def test_hostile_replies_end_without_a_loop_or_a_crash(data: bytes) -> None:
    found: dict[int, int] = {}
    try:
        unix_peers.parse(data, found)
    except struct.error:
        pytest.fail("a short reply must be read as far as it goes, not crash")
    assert all(isinstance(k, int) for k in found)


def test_a_well_formed_reply_gives_the_pair_and_its_end() -> None:
    body = struct.pack("=BBBBI8x", 1, 5, 1, 0, 77) + struct.pack("=HHI", 8, unix_peers.UNIX_DIAG_PEER, 78)
    found: dict[int, int] = {}
    assert unix_peers.parse(_msg(20, body) + _msg(unix_peers.NLMSG_DONE, b"\0\0\0\0"), found) is True
    assert found == {77: 78}
    stream_only: dict[int, int] = {}  # that socket is type 5 (seqpacket): a stream filter drops it
    assert unix_peers.parse(_msg(20, body) + _msg(unix_peers.NLMSG_DONE, b"\0\0\0\0"), stream_only, 1) is True
    assert stream_only == {}
