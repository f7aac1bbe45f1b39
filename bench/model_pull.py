#!/usr/bin/env python3
"""How fast is `provision model pull` next to `curl -o F URL && sha256sum F` and the hashing floor?

Goals: pull / (curl + sha256sum) <= 0.6, and pull / its one-pass floor <= 1.1.

Serves a 1 GiB GGUF-headed file on loopback (sendfile, so the server costs little), then times,
best of --runs each:
  baseline  bash -c 'curl -s -o F URL && sha256sum F'      (download, then a second pass to hash)
  pull      python -m provision model pull URL --sha256 H   (one pass: hash while streaming)
and, side by side in the same run, the two things every one-pass pull must do with those bytes:
  hash      hashlib's sha256 over them, from the page cache
  persist   writing them to a new file on the same disk and fdatasync-ing it (a pulled model
            must be on disk before it is renamed into the store: whole or not at all), the
            faster of through the page cache and O_DIRECT (Linux), each timed
The one-pass floor is the slower of the two: a pull that overlaps both perfectly takes that
long. Where the disk is slower than hashing, the hashing floor alone cannot be reached by a pull
that keeps its file durable; both ratios are printed. A 1 MiB pull from the same server, timed
in the same rounds, is what a pull costs besides streaming (interpreter, imports, the request,
fsync, rename); the stream ratio takes it off. Not a test: numbers depend on the machine and
its load.

    .venv/bin/python bench/model_pull.py [--size-mib 1024] [--runs 6] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
REPO = Path(__file__).resolve().parents[1]


def make_file(path: Path, size: int) -> str:
    """GGUF magic + pseudo-random bytes; returns the sha256 (hashing it also warms the page cache)."""
    block = os.urandom(4 * MIB)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        written = 0
        while written < size:
            chunk = (b"GGUF" + block[4:]) if written == 0 else block
            chunk = chunk[: size - written]
            f.write(chunk)
            h.update(chunk)
            written += len(chunk)
    return h.hexdigest()


def serve(files: dict[str, Path]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_GET(self) -> None:  # noqa: N802
            path = files[self.path]
            size = path.stat().st_size
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("ETag", '"bench"')
            self.end_headers()
            self.wfile.flush()
            with open(path, "rb") as f:
                self.connection.sendfile(f)
            self.close_connection = True

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def timed(cmd: list[str], env: dict[str, str] | None = None, *, sync: bool = True) -> float:
    if sync:
        os.sync()  # start each run without the previous one's dirty pages still being written back
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def hashlib_rate(path: Path) -> float:
    buf = bytearray(8 * MIB)
    view = memoryview(buf)
    h = hashlib.sha256()
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
    return path.stat().st_size / (time.perf_counter() - t0)


def persist_time(path: Path, work: Path, *, direct: bool) -> float:
    """Seconds to write ``path``'s bytes to a new file beside it and make them durable (fdatasync).

    ``direct``: with O_DIRECT from a page-aligned buffer (the last partial block through the page
    cache), as the pull writes on Linux.
    """
    view = memoryview(mmap.mmap(-1, 8 * MIB))  # page-aligned, as O_DIRECT wants
    target = work / "persist.bin"
    os.sync()
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as src, open(target, "wb", buffering=0) as dst:
        out = os.open(target, os.O_WRONLY | os.O_DIRECT) if direct else dst.fileno()
        offset = 0
        while n := src.readinto(view):
            whole = n // 4096 * 4096 if direct else n
            if whole:
                os.pwrite(out, view[:whole], offset)
            if whole < n:
                os.pwrite(dst.fileno(), view[whole:n], offset + whole)
            offset += n
        os.fdatasync(dst.fileno())
        if direct:
            os.close(out)
    elapsed = time.perf_counter() - t0
    target.unlink()
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (needs ~3x the size free)")
    args = ap.parse_args()
    if not shutil.which("curl") or not shutil.which("sha256sum"):
        print("bench needs curl and sha256sum (scripts/setup-debian installs curl)", file=sys.stderr)
        return 2
    size = args.size_mib * MIB
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="model-pull-bench-") as tmp:
        work = Path(tmp)
        source, small = work / "served.gguf", work / "small.gguf"
        sha = make_file(source, size)
        small_sha = make_file(small, MIB)
        httpd = serve({"/bench.gguf": source, "/small.gguf": small})
        url = f"http://127.0.0.1:{httpd.server_address[1]}/bench.gguf"
        out = work / "curl.gguf"
        baseline: list[float] = []
        parts: list[tuple[float, float]] = []
        pulls: list[float] = []
        smalls: list[float] = []
        rates: list[float] = []
        cached_runs: list[float] = []
        direct_runs: list[float] = []
        # Each round times every part, so a disk that slows for a minute slows the floor and the pull alike;
        # the pull and the O_DIRECT persist run back to back, first one then the other by turns, and each
        # follows the unlink of a GiB (a discard on this file system), so neither gets a quieter disk.
        for i in range(args.runs):
            # the same as `curl -s -o F URL && sha256sum F`, timed in its two parts
            fetch = timed(["curl", "-s", "-o", str(out), url])
            check = timed(["sha256sum", str(out)], sync=False)  # the second pass reads what curl wrote
            baseline.append(fetch + check)
            parts.append((fetch, check))
            out.unlink()
            cache = work / f"cache{i}"
            # as installed: with its bytecode cache (PYTHONDONTWRITEBYTECODE would time the compiler too)
            env = {
                **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                "PROVISION_CACHE": str(cache),
                "PYTHONPATH": str(REPO),
            }

            cmd = [sys.executable, "-m", "provision", "model", "pull", url, "--sha256", sha, "--name", "bench"]
            for step in ("pull", "direct") if i % 2 == 0 else ("direct", "pull"):
                if step == "pull":
                    pulls.append(timed(cmd, env))
                    shutil.rmtree(cache, ignore_errors=True)
                elif hasattr(os, "O_DIRECT"):
                    direct_runs.append(persist_time(source, work, direct=True))
            cached_runs.append(persist_time(source, work, direct=False))
            small_url = url.replace("/bench.gguf", "/small.gguf")
            cmd = [sys.executable, "-m", "provision", "model", "pull", small_url, "--sha256", small_sha, "--name", "s"]
            smalls.append(timed(cmd, env))
            shutil.rmtree(cache, ignore_errors=True)
            rates.append(hashlib_rate(source))
        rate = max(rates)
        cached = min(cached_runs)
        direct = min(direct_runs) if direct_runs else None
        httpd.shutdown()
    base, pull = min(baseline), min(pulls)
    limit = size / rate
    print(f"file: {size / MIB:.0f} MiB on loopback, best of {args.runs}; cpus: {os.cpu_count()}")
    runs = ", ".join(f"{a:.2f}+{b:.2f}" for a, b in parts)
    print(f"curl -o F URL && sha256sum F : {base:6.2f} s  (runs, curl+sha256sum: {runs})")
    print(f"provision model pull         : {pull:6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in pulls)})")
    persist = min(cached, direct) if direct is not None else cached
    floor = max(limit, persist)
    fixed = min(smalls)
    print(f"hashlib sha256 alone         : {limit:6.2f} s  ({rate / MIB:.0f} MiB/s)")
    listed = ", ".join(f"{t:.2f}" for t in cached_runs)
    print(f"write + fdatasync, cached    : {cached:6.2f} s  ({size / cached / MIB:.0f} MiB/s; runs: {listed})")
    if direct is not None:
        listed = ", ".join(f"{t:.2f}" for t in direct_runs)
        print(f"write + fdatasync, O_DIRECT  : {direct:6.2f} s  ({size / direct / MIB:.0f} MiB/s; runs: {listed})")
    print(f"a 1 MiB pull (start-up etc.) : {fixed:6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in smalls)})")
    bound = "the disk" if persist > limit else "hashing"
    print(f"one-pass floor               : {floor:6.2f} s  (the slower of the two: {bound})")
    print(f"ratio pull / (curl+sha256sum): {pull / base:.2f}  (goal <= 0.6; floor {floor / base:.2f})")
    print(f"ratio pull / one-pass floor  : {pull / floor:.2f}  (goal <= 1.1)")
    print(f"ratio stream / one-pass floor: {(pull - fixed) / floor:.2f}  (the pull less the 1 MiB pull's time)")
    # Each round's pull against that round's floor (its own hashing and persist, timed beside it): the
    # middle of these is the ratio least moved by a disk whose speed drifts from minute to minute.
    persists = [min(c, d) for c, d in zip(cached_runs, direct_runs, strict=True)] if direct_runs else cached_runs
    floors = [max(size / r, p) for r, p in zip(rates, persists, strict=True)]
    paired = [p / f for p, f in zip(pulls, floors, strict=True)]
    listed = ", ".join(f"{r:.2f}" for r in paired)
    print(f"pull / floor, round by round : {statistics.median(paired):.2f}  (median; runs: {listed}; goal <= 1.1)")
    mid_floor = max(size / statistics.median(rates), statistics.median(persists))
    print(f"median pull / median floor   : {statistics.median(pulls) / mid_floor:.2f}  (the runs' middles)")
    print(f"ratio pull / hashlib alone   : {pull / limit:.2f}  (reachable only where the disk outruns hashing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
