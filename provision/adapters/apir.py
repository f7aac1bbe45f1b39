"""ctypes: drive libggml-virtgpu-backend the way virglrenderer's APIR loader does, without a VM.

The library keeps its state process-global (the registered backend, the device, the ggml logger;
contexts of one process share them, patch 0020) and crashes if the dispatcher runs before a
successful initialize, so every
probe runs in a FRESH Python subprocess (``python -m provision.adapters.apir_child --child``) that
prints one ``RESULT {json}`` line. The parent never loads the library.

ABI (llama.cpp ggml/src/ggml-virtgpu/backend/backend-virgl-apir.h, shared/*.h):
  struct virgl_apir_callbacks { const char *(*get_config)(uint32_t ctx, const char *key);
                                void *(*get_shmem_ptr)(uint32_t ctx, uint32_t res_id); };
  uint32_t apir_backend_initialize(uint32_t ctx, struct virgl_apir_callbacks *);
  uint32_t apir_backend_dispatcher(uint32_t ctx, struct virgl_apir_callbacks *, uint32_t cmd,
                                   char *dec_cur, const char *dec_end, char *enc_cur,
                                   const char *enc_end, char **enc_cur_after);
initialize returns 3/4/5 for load failures, else 6 + backend_dispatch_initialize(): 6 is success.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provision.adapters import runner

# The hypervisor's knobs (virglrenderer reads the first, the backend library the others when
# virglrenderer passes no config map) and the config keys get_config is asked for.
ENV_BACKEND = "VIRGL_APIR_BACKEND_LIBRARY"
ENV_GGML_PATH = "APIR_LLAMA_CPP_GGML_LIBRARY_PATH"
ENV_GGML_REG = "APIR_LLAMA_CPP_GGML_LIBRARY_REG"
KEY_GGML_PATH = "ggml.library.path"
KEY_GGML_REG = "ggml.library.reg"
DEFAULT_REG = "ggml_backend_init"

# ApirLoadLibraryReturnCode (shared/api_remoting.h)
LOAD_CODES = {0: "SUCCESS", 1: "HYPERCALL_INITIALIZATION_ERROR", 2: "ALREADY_LOADED", 3: "ENV_VAR_MISSING",
              4: "CANNOT_OPEN", 5: "SYMBOL_MISSING"}
INIT_BASE_INDEX = 6
# APIR_BACKEND_INITIALIZE_* (shared/apir_backend.h), reported as INIT_BASE_INDEX + value
INIT_CODES = {0: "SUCCESS", 1: "CANNOT_OPEN_BACKEND_LIBRARY", 2: "CANNOT_OPEN_GGML_LIBRARY",
              3: "MISSING_BACKEND_SYMBOLS", 4: "MISSING_GGML_SYMBOLS", 5: "BACKEND_FAILED",
              6: "BACKEND_REG_FAILED", 7: "ALREADY_INITED", 8: "NO_DEVICE", 9: "BACKEND_INIT_FAILED"}

# Dispatch commands (shared/apir_backend.gen.h)
CMD = {
    "device_get_count": 1, "device_get_name": 2, "device_get_description": 3, "device_get_type": 4,
    "device_get_memory": 5, "device_get_buffer_type": 7, "device_get_props": 8,
    "buffer_type_get_name": 10, "buffer_type_get_alignment": 11, "buffer_type_get_max_size": 12,
    "buffer_type_alloc_buffer": 14, "buffer_get_base": 16, "buffer_clear": 20, "buffer_free_buffer": 21,
}
DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}
REQUIRED_SYMBOLS = ("apir_backend_initialize", "apir_backend_dispatcher")


def code_name(code: int) -> str:
    """SUCCESS, ENV_VAR_MISSING … for load codes; NO_DEVICE … for INIT_BASE_INDEX + x."""
    if code < INIT_BASE_INDEX:
        return LOAD_CODES.get(code, f"UNKNOWN({code})")
    return INIT_CODES.get(code - INIT_BASE_INDEX, f"UNKNOWN({code})")


def is_success(code: int | None) -> bool:
    # virglrenderer accepts 0 (never produced) and INIT_BASE_INDEX + SUCCESS.
    return code in (0, INIT_BASE_INDEX)


@dataclass(frozen=True)
class ProbeRequest:
    backend: str
    ggml_library: str | None
    ggml_reg: str | None
    ctx_id: int = 1
    init_twice: bool = False
    query_device: bool = True
    alloc_bytes: int = 0           # > 0: allocate, clear and free a buffer of this size
    bench_repeat: int = 0          # > 0: time every command this many times
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 180.0


@dataclass
class ProbeResult:
    request: dict[str, Any]
    stage: str                     # stat | dlopen | dlsym | initialize | dispatch | done | crash | timeout
    ok: bool
    loader_error: str | None = None
    code: int | None = None
    code_name: str | None = None
    first_code: int | None = None          # with init_twice: the first call's code (code is the second's)
    first_code_name: str | None = None
    get_config_calls: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    device: dict[str, Any] | None = None
    buffer: dict[str, Any] | None = None
    bench: list[dict[str, Any]] | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    ggml_libs_mapped: list[str] = field(default_factory=list)
    exit_status: int | None = None
    stderr_tail: str = ""
    wall_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def stat_backend(path: str) -> str | None:
    """virglrenderer's first check: the path exists and is a regular file. None when fine."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: not a regular file"
    return None


def probe(req: ProbeRequest) -> ProbeResult:
    """Run one probe in a fresh subprocess and return what it saw (never raises on a failed probe)."""
    problem = stat_backend(req.backend)
    if problem:
        return ProbeResult(asdict(req), "stat", False, loader_error=problem)
    env = dict(os.environ)
    env.update(req.env)
    # The child must import THIS provision package, not one that happens to sit in the cwd (-P).
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    started = time.perf_counter()
    proc = runner.run([sys.executable, "-P", "-m", "provision.adapters.apir_child", "--child",
                       json.dumps(asdict(req))], env=env, timeout=req.timeout_s)  # fmt: skip
    if proc.timed_out:
        return ProbeResult(asdict(req), "timeout", False, wall_ms=_ms(started), stderr_tail=proc.err[-1500:])
    wall = _ms(started)
    line = next((x for x in reversed(proc.out.splitlines()) if x.startswith("RESULT ")), None)
    if line is None:
        return ProbeResult(asdict(req), "crash", False, exit_status=proc.status,
                           stderr_tail=proc.err.strip()[-1500:], wall_ms=wall)
    data = json.loads(line[len("RESULT "):])
    result = ProbeResult(**data)
    result.exit_status = proc.status
    result.stderr_tail = proc.err.strip()[-1500:]
    result.wall_ms = wall
    return result


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
