"""The processes a GPU guest needs beside QEMU; one of them dying ends the run at once.

QEMU does not always notice: a render server killed while the guest holds no Vulkan context
is only missed at the next context, and a guest running ``sleep`` would then hold its GPU
slot until its deadline. So the run watches the render server (QEMU's child, recorded with
``procs.adopt`` once seen, so it is stopped with the run even if QEMU is gone). QEMU's GL display
is in QEMU itself (a render node, or SDL's offscreen driver: display.py): no X server to watch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from provision.adapters import runner
from provision.hosts.linux.run import render_workers


@dataclass
class Companions:
    qemu_pid: int
    run_dir: Path
    render_server: runner.Record | None = None

    def poll(self) -> str | None:
        """What died (a sentence), or None while every companion lives."""
        if self.render_server is None:
            for pid, name in render_workers.descendants(self.qemu_pid).items():
                if render_workers.RENDER_SERVER.match(name) and runner.parent(pid) == self.qemu_pid:
                    self.render_server = runner.adopt(pid, self.run_dir, "render-server")
                    break
        elif not self.render_server.alive():
            return f"the render server (pid {self.render_server.pid}, virgl_render_server) exited"
        return None
