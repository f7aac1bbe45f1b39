"""`provision serve` on Linux: a LinuxBackend run in a worker thread, its NIC forwarding only the port.

Stopping SIGTERMs QEMU, and the run's own cleanup (render server, GPU slot, reaping) then happens in the
worker exactly as on Ctrl-C.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import BinaryIO

from provision.core.errors import ProvisionError, VmFailed
from provision.hosts.linux.shell import terminate
from provision.serve.engine import GUEST_PORT, ServeRequest, guest_files

# A run's deadline is also a serve's: a served guest ends after 30 days at the latest.
SERVE_LIMIT_S = 30 * 24 * 3600.0


class LinuxGuest:
    """A LinuxBackend run in a worker thread. Stopping SIGTERMs QEMU: the run's own cleanup
    (render server, GPU slot, reaping) then happens in the worker, exactly as on Ctrl-C."""

    def __init__(self, req: ServeRequest, *, out: BinaryIO, err: BinaryIO) -> None:
        from provision.adapters import qemu
        from provision.hosts.linux.backend import LinuxBackend

        self.req = req
        self.backend = LinuxBackend(
            forward=qemu.Forward(req.host, req.port, GUEST_PORT),
            on_start=self._started,
            slot_wait_s=req.wait_s,
        )
        self.out, self.err = out, err
        self.qemu_pid: int | None = None
        self.run_dir: Path | None = None
        self._booted: float | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._status: int | None = None
        self._thread = threading.Thread(target=self._run, name=f"serve-{req.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        req = self.req
        command = req.command()
        model_name, beside = guest_files(req)  # a split model's parts under their own names
        try:
            res = self.backend.execute(
                req.stack,
                req.gpu,
                req.model_path,
                command,
                SERVE_LIMIT_S,
                req.route,
                stdout=self.out,
                stderr=self.err,
                model_name=model_name,
                model_extras=beside or None,
            )
            self._status = res.exit_status
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            self._error = exc

    def _started(self, pid: int, run_dir: Path) -> None:
        with self._lock:
            self.qemu_pid, self.run_dir, self._booted = pid, run_dir, time.monotonic()
            if self._stopping:
                terminate(pid)

    def running(self) -> bool:
        return self._thread.is_alive()

    def booted_at(self) -> float | None:
        return self._booted

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            pid = self.qemu_pid
        if pid is not None and self._thread.is_alive():
            terminate(pid)
        # QEMU goes within seconds; the worker then stops the render server and frees the slot.
        self._thread.join(timeout=60)

    def failure(self) -> ProvisionError:
        if isinstance(self._error, ProvisionError):
            return self._error
        where = f" (logs: {self.run_dir})" if self.run_dir else ""
        if self._error is not None:
            return VmFailed(f"the serve guest failed: {self._error!r}{where}")
        return VmFailed(
            f"llama-server exited with status {self._status} in the guest{where}",
            fix="see the server log above; `provision run STACK --model M -- llama-server --help` checks the flags",
        )

    def details(self) -> dict[str, object]:
        return {"qemu_pid": self.qemu_pid, "run_dir": str(self.run_dir) if self.run_dir else None}
