"""The child side of the APIR probe: runs inside a fresh subprocess and drives the library with ctypes.

``provision.adapters.apir.probe`` starts ``python -m provision.adapters.apir_child --child JSON``;
this module loads libggml-virtgpu-backend, plays virglrenderer's part (callbacks, the wire
format) and prints one ``RESULT {json}`` line. The parent never loads the library.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from provision.adapters.apir import (
    CMD,
    DEVICE_TYPES,
    KEY_GGML_PATH,
    KEY_GGML_REG,
    REQUIRED_SYMBOLS,
    ProbeRequest,
    ProbeResult,
    _ms,
    code_name,
    is_success,
)


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
        print("internal: run as python -m provision.adapters.apir_child --child JSON", file=sys.stderr)
        raise SystemExit(2)
