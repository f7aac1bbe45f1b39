"""ctypes: drive libggml-virtgpu-backend the way virglrenderer's APIR loader does, without a VM.

The library keeps all of its state process-global (the registered backend, the device, the
ggml logger) and crashes if the dispatcher runs before a successful initialize, so every
probe runs in a FRESH Python subprocess (``python -m provision.adapters.apir --child``) that
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
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
    try:
        proc = subprocess.run([sys.executable, "-P", "-m", "provision.adapters.apir", "--child",
                               json.dumps(asdict(req))], env=env, capture_output=True, text=True, timeout=req.timeout_s)
    except subprocess.TimeoutExpired as exc:
        return ProbeResult(asdict(req), "timeout", False, wall_ms=_ms(started),
                           stderr_tail=(exc.stderr or b"")[-1500:].decode(errors="replace")
                           if isinstance(exc.stderr, bytes) else str(exc.stderr or "")[-1500:])
    wall = _ms(started)
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT ")), None)
    if line is None:
        return ProbeResult(asdict(req), "crash", False, exit_status=proc.returncode,
                           stderr_tail=proc.stderr.strip()[-1500:], wall_ms=wall)
    data = json.loads(line[len("RESULT "):])
    result = ProbeResult(**data)
    result.exit_status = proc.returncode
    result.stderr_tail = proc.stderr.strip()[-1500:]
    result.wall_ms = wall
    return result


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


# ---------------------------------------------------------------------------------------------
# Child side: everything below runs inside the fresh subprocess.


def _child(req_data: dict[str, Any]) -> ProbeResult:
    import ctypes as C

    req = ProbeRequest(**req_data)
    res = ProbeResult(req_data, "dlopen", False)

    get_config_t = C.CFUNCTYPE(C.c_void_p, C.c_uint32, C.c_char_p)
    get_shmem_t = C.CFUNCTYPE(C.c_void_p, C.c_uint32, C.c_uint32)
    log_t = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)

    class Callbacks(C.Structure):
        _fields_ = [("get_config", get_config_t), ("get_shmem_ptr", get_shmem_t)]

    started = time.perf_counter()
    try:
        lib = C.CDLL(req.backend)  # RTLD_NOW | RTLD_LOCAL, like virglrenderer's dlopen
    except OSError as exc:
        res.loader_error = str(exc)
        return res
    res.timings_ms["dlopen_backend"] = _ms(started)
    res.stage = "dlsym"
    missing = [s for s in REQUIRED_SYMBOLS if not hasattr(lib, s)]
    if missing:
        res.loader_error = f"{req.backend}: undefined symbol(s) {', '.join(missing)}"
        return res
    init = lib.apir_backend_initialize
    init.argtypes = [C.c_uint32, C.POINTER(Callbacks)]
    init.restype = C.c_uint32
    dispatch = lib.apir_backend_dispatcher
    dispatch.argtypes = [C.c_uint32, C.POINTER(Callbacks), C.c_uint32, C.c_void_p, C.c_void_p, C.c_void_p,
                         C.c_void_p, C.POINTER(C.c_void_p)]
    dispatch.restype = C.c_uint32

    # ggml's logger is process-wide: install ours on the libggml-base the backend already mapped.
    logs: list[str] = []

    @log_t
    def on_log(level: int, text: bytes, _user: Any) -> None:
        logs.append(f"[{level}] {text.decode(errors='replace').rstrip()}")

    try:
        base = C.CDLL("libggml-base.so.0")
        base.ggml_log_set.argtypes = [log_t, C.c_void_p]
        base.ggml_log_set.restype = None
        base.ggml_log_set(on_log, None)
    except (OSError, AttributeError) as exc:
        logs.append(f"[krun-gpu] ggml log capture unavailable: {exc}")

    answers = {KEY_GGML_PATH: req.ggml_library, KEY_GGML_REG: req.ggml_reg}
    buffers = {k: C.create_string_buffer(v.encode()) for k, v in answers.items() if v is not None}

    @get_config_t
    def get_config(_ctx: int, key: bytes) -> int | None:
        name = key.decode()
        res.get_config_calls.append(name)
        buf = buffers.get(name)
        # Return memory that stays alive; a c_char_p restype would hand out a temporary.
        return C.addressof(buf) if buf is not None else None

    @get_shmem_t
    def get_shmem(_ctx: int, _res: int) -> None:
        return None

    cbs = Callbacks(get_config, get_shmem)
    res.stage = "initialize"
    started = time.perf_counter()
    code = int(init(req.ctx_id, C.byref(cbs)))
    res.timings_ms["initialize"] = _ms(started)
    res.code, res.code_name = code, code_name(code)
    if req.init_twice and is_success(code):
        # What a second VM context in the same render process would get.
        res.first_code, res.first_code_name = code, res.code_name
        code = int(init(req.ctx_id, C.byref(cbs)))
        res.code, res.code_name = code, code_name(code)
    if not is_success(code):
        res.logs = logs
        return res

    res.stage = "dispatch"
    wire = _Wire(C, dispatch, req.ctx_id, cbs)
    if req.query_device:
        res.device = _query_device(wire)
    if req.alloc_bytes > 0:
        res.buffer = _buffer_round_trip(wire, req.alloc_bytes)
    if req.bench_repeat > 0:
        res.bench = _bench(wire, req.bench_repeat, req.alloc_bytes or (1 << 20))
    res.timings_ms.update(wire.first_call_ms)
    started = time.perf_counter()
    lib.apir_backend_deinit.argtypes = [C.c_uint32]
    lib.apir_backend_deinit(req.ctx_id)
    res.timings_ms["deinit"] = _ms(started)
    res.stage = "done"
    res.ok = wire.failures == 0
    res.logs = logs
    return res


class _Wire:
    """One dispatcher call at a time, with the reply decoded as little-endian fields."""

    def __init__(self, C: Any, dispatch: Any, ctx_id: int, cbs: Any) -> None:
        self.C, self.dispatch, self.ctx_id, self.cbs = C, dispatch, ctx_id, cbs
        # The encoder's bounds checks are asserts, compiled out of Release builds: be generous.
        self.dec = C.create_string_buffer(256)
        self.enc = C.create_string_buffer(16384)
        self.first_call_ms: dict[str, float] = {}
        self.failures = 0
        self.rets: dict[str, int] = {}

    def call(self, name: str, payload: bytes = b"") -> tuple[int, bytes, float]:
        C = self.C
        C.memmove(self.dec, payload, len(payload))
        after = C.c_void_p()
        dec0, enc0 = C.addressof(self.dec), C.addressof(self.enc)
        started = time.perf_counter_ns()
        ret = int(self.dispatch(self.ctx_id, C.byref(self.cbs), CMD[name], dec0, dec0 + len(payload),
                                enc0, enc0 + len(self.enc), C.byref(after)))
        elapsed = (time.perf_counter_ns() - started) / 1e6
        self.first_call_ms.setdefault(f"cmd.{name}", round(elapsed, 3))
        self.rets[name] = ret
        if ret != 0:
            self.failures += 1
        reply = self.enc.raw[: after.value - enc0] if after.value else b""
        return ret, reply, elapsed


def _u32(b: bytes, off: int = 0) -> int:
    return int.from_bytes(b[off:off + 4], "little")


def _u64(b: bytes, off: int = 0) -> int:
    return int.from_bytes(b[off:off + 8], "little")


def _string(b: bytes) -> str:
    # apir_encode_array_size (u64, includes the NUL) + the bytes
    n = _u64(b)
    return b[8:8 + max(n - 1, 0)].decode(errors="replace")


def _query_device(w: _Wire) -> dict[str, Any]:
    dev: dict[str, Any] = {}
    _, b, _ = w.call("device_get_count")
    dev["count"] = _u32(b)
    _, b, _ = w.call("device_get_name")
    dev["name"] = _string(b)
    _, b, _ = w.call("device_get_description")
    dev["description"] = _string(b)
    _, b, _ = w.call("device_get_type")
    dev["type"] = DEVICE_TYPES.get(_u32(b), str(_u32(b)))
    # The first memory query is what creates a CUDA context: proof of a usable GPU.
    _, b, _ = w.call("device_get_memory")
    dev["memory_free"], dev["memory_total"] = _u64(b), _u64(b, 8)
    _, b, _ = w.call("device_get_props")
    names = ("async", "host_buffer", "buffer_from_host_ptr", "events", "mmap")
    dev["caps"] = {n: bool(b[i * 4]) if len(b) > i * 4 else None for i, n in enumerate(names)}
    _, b, _ = w.call("device_get_buffer_type")
    buft = b[:8]
    _, b, _ = w.call("buffer_type_get_name", buft)
    dev["buffer_type"] = _string(b)
    _, b, _ = w.call("buffer_type_get_alignment", buft)
    dev["buffer_alignment"] = _u64(b)
    _, b, _ = w.call("buffer_type_get_max_size", buft)
    dev["buffer_max_size"] = _u64(b)
    dev["dispatch_returns"] = dict(w.rets)
    return dev


def _buffer_round_trip(w: _Wire, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {"size": size}
    _, b, _ = w.call("device_get_buffer_type")
    buft = b[:8]
    _, b, _ = w.call("device_get_memory")
    out["free_before"] = _u64(b)
    ret, b, ms = w.call("buffer_type_alloc_buffer", buft + size.to_bytes(8, "little"))
    handle = b[:8]
    out["alloc_ms"] = round(ms, 3)
    out["allocated"] = ret == 0 and _u64(handle) != 0
    if not out["allocated"]:
        w.failures += 1
        return out
    _, b, _ = w.call("buffer_get_base", handle)
    out["base_nonzero"] = _u64(b) != 0
    ret, _, ms = w.call("buffer_clear", handle + (0x5A).to_bytes(4, "little"))
    out["clear_ms"], out["cleared"] = round(ms, 3), ret == 0
    _, b, _ = w.call("device_get_memory")
    out["free_after_alloc"] = _u64(b)
    ret, _, ms = w.call("buffer_free_buffer", handle)
    out["free_ms"], out["freed"] = round(ms, 3), ret == 0
    _, b, _ = w.call("device_get_memory")
    out["free_after_free"] = _u64(b)
    return out


_SIZED_COMMANDS = ("buffer_type_alloc_buffer", "buffer_clear", "buffer_free_buffer")


def _bench(w: _Wire, repeat: int, size: int) -> list[dict[str, Any]]:
    """Round-trip time of each query `repeat` times and of alloc/base/clear/free cycles repeat/10 times
    (at least 5), after one warm-up call or cycle each."""
    _, b, _ = w.call("device_get_buffer_type")
    buft = b[:8]
    samples: dict[str, list[float]] = {}
    simple = [("device_get_count", b""), ("device_get_name", b""), ("device_get_description", b""),
              ("device_get_type", b""), ("device_get_memory", b""), ("device_get_props", b""),
              ("device_get_buffer_type", b""), ("buffer_type_get_name", buft),
              ("buffer_type_get_alignment", buft), ("buffer_type_get_max_size", buft)]
    for name, payload in simple:
        w.call(name, payload)
        samples[name] = [w.call(name, payload)[2] for _ in range(repeat)]
    for name in ("buffer_type_alloc_buffer", "buffer_get_base", "buffer_clear", "buffer_free_buffer"):
        samples[name] = []
    # Buffer cycles touch real memory (a CPU clear is a memset), so fewer of them.
    cycles = max(5, repeat // 10)
    for _ in range(cycles + 1):
        ret, b, ms_alloc = w.call("buffer_type_alloc_buffer", buft + size.to_bytes(8, "little"))
        handle = b[:8]
        if ret != 0 or _u64(handle) == 0:
            w.failures += 1
            break
        ms_base = w.call("buffer_get_base", handle)[2]
        ms_clear = w.call("buffer_clear", handle + bytes(4))[2]
        ms_free = w.call("buffer_free_buffer", handle)[2]
        if _ == 0:
            continue  # warm-up cycle
        for name, ms in (("buffer_type_alloc_buffer", ms_alloc), ("buffer_get_base", ms_base),
                         ("buffer_clear", ms_clear), ("buffer_free_buffer", ms_free)):
            samples[name].append(ms)
    rows = []
    for name, values in samples.items():
        values = sorted(values)
        if not values:
            continue
        rows.append({"command": name, "cmd": CMD[name], "n": len(values),
                     "min_us": round(values[0] * 1000, 2),
                     "median_us": round(values[len(values) // 2] * 1000, 2),
                     "p95_us": round(values[min(len(values) - 1, int(len(values) * 0.95))] * 1000, 2),
                     "bytes": size if name in _SIZED_COMMANDS else None})
    return rows


def _child_main(arg: str) -> None:
    req_data = json.loads(arg)
    result = _child(req_data)
    with open("/proc/self/maps") as fh:
        result.ggml_libs_mapped = sorted({ln.split()[-1] for ln in fh if "libggml" in ln})
    print("RESULT " + json.dumps(result.as_dict()), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child_main(sys.argv[2])
    else:
        print("internal: run as python -m provision.adapters.apir --child JSON", file=sys.stderr)
        raise SystemExit(2)
