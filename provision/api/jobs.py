"""Jobs of the execution API: each runs in its own thread, a guest run on the Linux host.

A job waits for one of the server's ``--max-vms`` places, then for a GPU slot when it wants
the GPU (provision/slots.py, the same flock slots `provision run --gpu` takes, so CLI and API
share them), then boots a fresh guest that runs ``sh -c CODE``. The host tells the job its VM started
(``RunIO.on_start``). Everything it reports (the VM's start, output lines, the end) goes
through one ``emit`` callback, which the web layer
turns into a stream or a single response. ``job.cancel`` stops the guest from any thread.
"""

from __future__ import annotations

import io
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provision import hosts
from provision.core.catalog import Stack
from provision.core.errors import ProvisionError, RunCancelled, RunTimeout
from provision.core.log import say
from provision.hosts import Host, RunIO, RunRequest, RunResult

Event = dict[str, Any]
Emit = Callable[[Event], None]

DEVICE_MARKER = re.compile(rb"KRUN-DEVICE=([^\r\n]*)")
# Which device the guest's Vulkan loader picks, written to the console (not the job's output).
VENUS_PROBE = (
    "d=$(vulkaninfo --summary 2>/dev/null"
    " | sed -n 's/^[[:space:]]*deviceName[[:space:]]*=[[:space:]]*//p' | head -n 1)\n"
    'echo "KRUN-DEVICE=${d:-none}" > /dev/console\n'
)
# A line longer than this is passed on in pieces (a program writing without newlines).
MAX_LINE_BYTES = 64 * 1024


def guest_command(code: str, probe_venus: bool) -> list[str]:
    """``sh -c CODE`` in the guest, CODE passed as an argument so no quoting can break out of it."""
    program = (VENUS_PROBE if probe_venus else "") + 'exec sh -c "$1"'
    return ["sh", "-c", program, "krun-api", code]


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()


class LineSink(io.BytesIO):
    """Where the backend copies the guest's stdout or stderr: emits whole lines, keeps a capped copy."""

    def __init__(self, name: str, emit: Emit, cap: int) -> None:
        super().__init__()
        self.name, self.emit, self.cap = name, emit, cap
        self.captured = bytearray()
        self.truncated = False
        self._partial = b""

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        room = self.cap - len(self.captured)
        self.captured += chunk[: max(room, 0)]
        self.truncated = self.truncated or len(chunk) > room
        self._partial += chunk
        *lines, self._partial = self._partial.split(b"\n")
        for line in lines:
            self._send(line + b"\n")
        if len(self._partial) >= MAX_LINE_BYTES:
            self._send(self._partial)
            self._partial = b""
        return len(chunk)

    def flush(self) -> None:
        """Whole lines went out in write(); a last line without newline waits for finish()."""

    def finish(self) -> None:
        if self._partial:
            self._send(self._partial)
            self._partial = b""

    def text(self) -> str:
        return bytes(self.captured).decode(errors="replace")

    def _send(self, data: bytes) -> None:
        self.emit({"event": self.name, "data": data.decode(errors="replace"), "t": iso(time.time())})


@dataclass(frozen=True)
class JobSpec:
    stack: Stack
    gpu: bool
    code: str
    timeout_s: float
    model_path: Path | None = None
    model_name: str | None = None

    @property
    def route(self) -> str:
        """The way the guest reaches a device: the stack's route with the GPU, else plain CPU."""
        return self.stack.route if self.gpu else "cpu"


class Job:
    def __init__(self, spec: JobSpec, emit: Emit, capture_bytes: int, log: Callable[[str], None]) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.spec = spec
        self.emit = emit
        self.log = log
        self.cancel = threading.Event()
        self.done = threading.Event()
        self.accepted_at = time.time()
        self.deadline = time.monotonic() + spec.timeout_s
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.qemu_pid: int | None = None
        self.stdout = LineSink("stdout", emit, capture_bytes)
        self.stderr = LineSink("stderr", emit, capture_bytes)

    def on_start(self, pid: int, run_dir: Path) -> None:
        """The VM exists: that is when the job started (a guest booted twice starts once)."""
        if self.started_at is None:
            self.started_at = time.time()
            self.qemu_pid = pid
            self.emit({"event": "started", "job": self.id, "qemu_pid": pid, "t": iso(self.started_at)})

    def say(self, text: str) -> None:
        self.log(f"job {self.id}: {text}")

    def result(self, run: RunResult, device: str | None) -> Event:
        assert self.started_at is not None and self.ended_at is not None
        return {
            "event": "exit",
            "job": self.id,
            "stack": self.spec.stack.name,
            "route": self.spec.route,
            "gpu": self.spec.gpu,
            "device": device,
            "exit_code": run.exit_status,
            "stdout": self.stdout.text(),
            "stderr": self.stderr.text(),
            "stdout_truncated": self.stdout.truncated,
            "stderr_truncated": self.stderr.truncated,
            "accel": run.accel,
            "qemu_pid": run.pid,
            "accepted_at": iso(self.accepted_at),
            "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at),
            "queued_s": round(self.started_at - self.accepted_at, 3),
            "duration_s": round(self.ended_at - self.started_at, 3),
        }


def read_device(run_dir: Path) -> str | None:
    try:
        m = DEVICE_MARKER.search((run_dir / "console.log").read_bytes())
    except OSError:
        return None
    name = m.group(1).decode(errors="replace").strip() if m else ""
    return None if name in ("", "none") else name


class Runner:
    """Starts jobs, caps how many hold a VM place, and stops them all when the server stops."""

    def __init__(
        self,
        max_vms: int,
        capture_bytes: int,
        log: Callable[[str], None] | None = None,
        host: Host | None = None,
    ) -> None:
        self.max_vms = max_vms
        self.capture_bytes = capture_bytes
        progress = say("api")
        self.log = log or (lambda s: progress(f"provision api: {s}"))
        self.host = host or hosts.get("linux")
        self.draining = False
        self._places = threading.Semaphore(max_vms)
        self._lock = threading.Lock()
        self._jobs: dict[str, tuple[Job, threading.Thread]] = {}
        self._drain_timer: threading.Timer | None = None

    # --- what health reports ------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        with self._lock:
            jobs = [j for j, _ in self._jobs.values()]
        running = sum(1 for j in jobs if j.started_at is not None)
        return {"running": running, "waiting": len(jobs) - running}

    # --- jobs ---------------------------------------------------------------------------

    def submit(self, spec: JobSpec, emit: Emit) -> Job:
        if self.draining:
            raise RunCancelled("the API server is stopping and takes no new jobs", fix="retry on its successor")
        job = Job(spec, emit, self.capture_bytes, self.log)
        thread = threading.Thread(target=self._run, args=(job,), name=f"job-{job.id}")
        with self._lock:
            self._jobs[job.id] = (job, thread)
        thread.start()
        return job

    def _run(self, job: Job) -> None:
        final: Event
        try:
            self._take_place(job)
            try:
                final = self._execute(job)
            finally:
                self._places.release()
        except ProvisionError as exc:
            final = {"event": "error", "job": job.id, "error": exc}
        except Exception:  # a bug: the log gets the traceback, the client a short report
            self.log(f"job {job.id} failed:\n{traceback.format_exc()}")
            final = {"event": "error", "job": job.id, "error": None}
        finally:
            job.stdout.finish()
            job.stderr.finish()
            with self._lock:
                self._jobs.pop(job.id, None)
        job.done.set()
        job.emit(final)

    def _take_place(self, job: Job) -> None:
        while not self._places.acquire(timeout=0.2):
            if job.cancel.is_set() or self.draining:
                raise RunCancelled("the job was cancelled before its VM started")
            if time.monotonic() >= job.deadline:
                raise RunTimeout(
                    f"no VM place became free before the deadline (all {self.max_vms} in use)",
                    fix="raise timeout, or start the server with a larger --max-vms",
                )

    def _execute(self, job: Job) -> Event:
        spec = job.spec
        remaining = job.deadline - time.monotonic()
        if remaining <= 0:
            raise RunTimeout("the deadline passed before the VM could start")
        probe = spec.gpu and spec.stack.route == "venus"
        req = RunRequest(spec.stack, spec.gpu, tuple(guest_command(spec.code, probe)), model_path=spec.model_path,
                         model_name=spec.model_name, timeout_s=remaining)  # fmt: skip
        io = RunIO(out=job.stdout, err=job.stderr, cancel=job.cancel, on_start=job.on_start, say=job.say)
        run = self.host.run(req, io)
        job.ended_at = time.time()
        device = read_device(run.run_dir) if probe and run.run_dir else (None if spec.gpu else "cpu")
        return job.result(run, device)

    # --- stopping -----------------------------------------------------------------------

    def drain(self, grace_s: float) -> None:
        """No new VMs from now on; running guests get ``grace_s`` to finish, then are stopped."""
        self.draining = True
        with self._lock:
            jobs = [j for j, _ in self._jobs.values()]
        for job in jobs:
            if job.started_at is None:
                job.cancel.set()
        self.log(f"stopping: {len(jobs)} job(s) in flight, {grace_s:g} s to finish")
        if self._drain_timer is None:
            self._drain_timer = threading.Timer(grace_s, self.cancel_all)
            self._drain_timer.daemon = True
            self._drain_timer.start()

    def cancel_all(self) -> None:
        with self._lock:
            jobs = [j for j, _ in self._jobs.values()]
        for job in jobs:
            job.cancel.set()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Cancel every job and wait until their threads (and so their VMs) are gone."""
        self.draining = True
        self.cancel_all()
        end = time.monotonic() + timeout_s
        with self._lock:
            threads = [t for _, t in self._jobs.values()]
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        if self._drain_timer is not None:
            self._drain_timer.cancel()
