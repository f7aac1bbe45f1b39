"""`provision serve` on Linux: one guest run in a worker thread, its NIC forwarding only the port.

Stopping SIGTERMs QEMU, and the run's own cleanup (render server, GPU slot, reaping) then happens in the
worker exactly as on Ctrl-C.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import BinaryIO

from provision.core.errors import ProvisionError, VmFailed
from provision.hosts import Forward, RunIO, RunRequest
from provision.hosts.linux.run.shell import terminate
from provision.hosts.requests import LONGEST_RUN_S
from provision.serve.engine import GUEST_PORT, ServeRequest, guest_files


def run_request(req: ServeRequest) -> RunRequest:
    """The guest run that serves ``req``: llama-server, the one published port, a bounded slot wait."""
    model_name, beside = guest_files(req)  # a split model's parts under their own names
    return RunRequest(
        req.stack,
        req.gpu,
        tuple(req.command()),
        model_path=req.model_path,
        model_name=model_name,
        model_extras=tuple(sorted(beside.items())),
        route=req.route,
        timeout_s=LONGEST_RUN_S,  # a run's deadline is also a serve's: it ends after 30 days at the latest
        forward=Forward(req.host, req.port, GUEST_PORT),
        slot_wait_s=req.wait_s,
    )


class LinuxGuest:
    """A guest run in a worker thread. Stopping SIGTERMs QEMU: the run's own cleanup
    (render server, GPU slot, reaping) then happens in the worker, exactly as on Ctrl-C."""

    def __init__(self, req: ServeRequest, *, out: BinaryIO, err: BinaryIO) -> None:
        self.req = req
        self.run_req = run_request(req)  # checked here, before any thread starts
        self.io = RunIO(out=out, err=err, on_start=self._started)
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
        from provision.hosts.linux.run import execute

        try:
            self._status = execute.run(self.run_req, self.io).exit_status
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
