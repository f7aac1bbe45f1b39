"""QEMU's side of the render server, and nothing more: run as ``python qemu_standin.py ARGV...``.

It starts the real ``virgl_render_server`` (ARGV, with ``--socket-fd`` added) as QEMU's
virglrenderer proxy does, sends INIT and CREATE_CONTEXT over the seqpacket socket
(server/render_protocol.h), keeps the context socket the server hands back, and then obeys
one line at a time on stdin: ``open`` (a guest program opens its context: a new worker),
``close`` (the guest program ends: QEMU closes that context, as proxy_context_destroy does),
``quit``. It prints ``ready N`` after each command, N the number of contexts it holds.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys

INIT, CREATE_CONTEXT, DESTROY_CONTEXT = 1, 3, 4
VIRGL_RENDERER_VENUS, VIRGL_RENDERER_NO_VIRGL = 1 << 6, 1 << 7


def main() -> None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = subprocess.Popen([*sys.argv[1:], f"--socket-fd={theirs.fileno()}"], pass_fds=[theirs.fileno()])
    theirs.close()
    mine.send(struct.pack("=II", INIT, VIRGL_RENDERER_VENUS | VIRGL_RENDERER_NO_VIRGL))
    contexts: list[tuple[int, socket.socket]] = []
    next_id = 1
    for line in sys.stdin:
        command = line.strip()
        if command == "open":
            mine.send(struct.pack("=II32s", CREATE_CONTEXT, next_id, b"standin"))
            reply, ancillary, _flags, _addr = mine.recvmsg(16, socket.CMSG_SPACE(4))
            assert reply[:1] == b"\x01" and ancillary, f"the render server refused the context: {reply!r}"
            fd = struct.unpack("=i", ancillary[0][2][:4])[0]
            contexts.append((next_id, socket.socket(fileno=fd)))
            next_id += 1
        elif command == "close":
            ctx_id, ctx = contexts.pop(0)
            mine.send(struct.pack("=II", DESTROY_CONTEXT, ctx_id))
            ctx.close()
        elif command == "quit":
            break
        print(f"ready {len(contexts)}", flush=True)
    server.kill()
    server.wait()


if __name__ == "__main__":
    main()
