#!/usr/bin/env python3
"""How fast is `provision model pull` next to `curl -o F URL && sha256sum F` and the one-pass floor?

Goals: pull / (curl + sha256sum) <= 0.6, and pull / its one-pass floor <= 1.1 over all rounds.

Serves a 1 GiB GGUF-headed file on loopback (sendfile, so the server costs little) and times
  baseline  curl -s -o F URL, then sha256sum F  (download, then a second pass to hash), --baseline-runs times
and, in each of --runs rounds, in an order shuffled afresh each round:
  pull      python -m provision model pull URL --sha256 H   (one pass: hash while streaming)
  small     the same for a 1 MiB file: what a pull costs besides streaming (interpreter, imports,
            the request, fsync, rename)
  hash      hashlib's sha256 over the GiB, from the page cache
  persist   writing the GiB to a new file on the same disk and fdatasync-ing it (a pulled model
            must be on disk before it is renamed into the store: whole or not at all), through
            the page cache and with O_DIRECT (Linux), reads overlapping writes as in the pull
A round's one-pass floor is the slower of hashing and the faster persist: a pull that overlaps
both perfectly takes that long. Where the disk is slower than hashing, the hashing floor alone
cannot be reached by a pull that keeps its file durable; both ratios are printed. The verdict is
the pulls' time over their rounds' floors, summed, with a bootstrap interval over the rounds.
Not a test: numbers depend on the machine and its load.

    .venv/bin/python bench/model_pull.py [--size-mib 1024] [--runs 12] [--baseline-runs 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
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


def hash_seconds(path: Path) -> float:
    """Seconds for hashlib's sha256 over ``path`` (from the page cache: make_file just wrote it)."""
    buf = bytearray(8 * MIB)
    view = memoryview(buf)
    h = hashlib.sha256()
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
    return time.perf_counter() - t0


def persist_time(path: Path, work: Path, *, direct: bool) -> float:
    """Seconds to write ``path``'s bytes to a new file beside it and make them durable (fdatasync).

    ``direct``: with O_DIRECT from page-aligned buffers (the last partial block through the page
    cache), as the pull writes on Linux. Reading the next buffer overlaps writing the last, as the
    pull's socket reads overlap its writes: a loop that read and wrote by turns was 4-11 % slower
    here, and a floor that is slower than it need be flatters the pull.
    """
    free: queue.Queue[memoryview] = queue.Queue()
    for _ in range(4):
        free.put(memoryview(mmap.mmap(-1, 8 * MIB)))  # page-aligned, as O_DIRECT wants
    filled: queue.Queue[tuple[memoryview, int, int] | None] = queue.Queue()
    target = work / "persist.bin"
    os.sync()
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as src, open(target, "wb", buffering=0) as dst:
        out = os.open(target, os.O_WRONLY | os.O_DIRECT) if direct else dst.fileno()
        failed: list[BaseException] = []

        def write() -> None:
            while (item := filled.get()) is not None:
                view, n, offset = item
                try:
                    if not failed:
                        whole = n // 4096 * 4096 if direct else n
                        if whole:
                            os.pwrite(out, view[:whole], offset)
                        if whole < n:
                            os.pwrite(dst.fileno(), view[whole:n], offset + whole)
                except BaseException as exc:  # kept for the reader to raise; the buffers still go back
                    failed.append(exc)
                free.put(view)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            offset = 0
            while not failed and (n := src.readinto(view := free.get())):
                filled.put((view, n, offset))
                offset += n
        finally:
            filled.put(None)
            writer.join()
            if direct:
                os.close(out)
        if failed:
            raise failed[0]
        os.fdatasync(dst.fileno())
    elapsed = time.perf_counter() - t0
    target.unlink()
    return elapsed


def interval(pulls: list[float], floors: list[float], seed: int = 0) -> tuple[float, float]:
    """A 90 % bootstrap interval of sum(pulls) / sum(floors), resampling whole rounds."""
    rng = random.Random(seed)
    rounds = list(zip(pulls, floors, strict=True))
    ratios = sorted(
        sum(p for p, _ in sample) / sum(f for _, f in sample)
        for sample in ([rng.choice(rounds) for _ in rounds] for _ in range(2000))
    )
    return ratios[len(ratios) // 20 - 1], ratios[len(ratios) * 19 // 20 - 1]  # nearest rank: the 100th, 1900th


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=12, help="rounds of pull, persist and hashing")
    ap.add_argument("--baseline-runs", type=int, default=3, help="runs of curl + sha256sum")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (needs ~3x the size free)")
    args = ap.parse_args()
    if not shutil.which("curl") or not shutil.which("sha256sum"):
        print("bench needs curl and sha256sum (scripts/setup-debian installs curl)", file=sys.stderr)
        return 2
    if min(args.runs, args.baseline_runs, args.size_mib) < 1:
        print("--runs, --baseline-runs and --size-mib want at least 1", file=sys.stderr)
        return 2
    size = args.size_mib * MIB
    times: dict[str, list[float]] = {k: [] for k in ("pull", "small", "hash", "cached", "direct")}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="model-pull-bench-") as tmp:
        work = Path(tmp)
        source, small = work / "served.gguf", work / "small.gguf"
        sha = make_file(source, size)
        small_sha = make_file(small, MIB)
        httpd = serve({"/bench.gguf": source, "/small.gguf": small})
        url = f"http://127.0.0.1:{httpd.server_address[1]}/bench.gguf"
        small_url = url.replace("/bench.gguf", "/small.gguf")
        out = work / "curl.gguf"
        parts: list[tuple[float, float]] = []
        for _ in range(args.baseline_runs):
            # the same as `curl -s -o F URL && sha256sum F`, timed in its two parts
            fetch = timed(["curl", "-s", "-o", str(out), url])
            check = timed(["sha256sum", str(out)], sync=False)  # the second pass reads what curl wrote
            parts.append((fetch, check))
            out.unlink()
        cache = work / "cache"
        # as installed: with its bytecode cache (PYTHONDONTWRITEBYTECODE would time the compiler too)
        env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
            "PROVISION_CACHE": str(cache),
            "PYTHONPATH": str(REPO),
        }
        pull_cmd = [sys.executable, "-m", "provision", "model", "pull", url, "--sha256", sha, "--name", "bench"]
        small_cmd = [*pull_cmd[:5], small_url, "--sha256", small_sha, "--name", "s"]

        def pull(cmd: list[str]) -> float:
            try:
                return timed(cmd, env)
            finally:
                shutil.rmtree(cache, ignore_errors=True)

        steps: dict[str, Callable[[], None]] = {
            "pull": lambda: times["pull"].append(pull(pull_cmd)),
            "small": lambda: times["small"].append(pull(small_cmd)),
            "hash": lambda: times["hash"].append(hash_seconds(source)),
            "cached": lambda: times["cached"].append(persist_time(source, work, direct=False)),
        }
        if hasattr(os, "O_DIRECT"):
            steps["direct"] = lambda: times["direct"].append(persist_time(source, work, direct=True))
        # Every round times every part, in an order shuffled afresh, so that a disk which slows for a
        # minute slows the floor and the pull alike and no part always follows the same other one
        # (each 1 GiB part ends by deleting its file: a discard on this file system).
        order = random.Random()
        for _ in range(args.runs):
            for name in order.sample(list(steps), len(steps)):
                steps[name]()
        httpd.shutdown()
    report(size, args.runs, parts, times)
    return 0


def report(size: int, runs: int, parts: list[tuple[float, float]], times: dict[str, list[float]]) -> None:
    def line(label: str, value: str, note: str) -> None:
        print(f"{label:29s}: {value}  ({note})")

    def timing(label: str, values: list[float]) -> None:
        line(label, f"{statistics.median(values):6.2f} s", "median; runs: " + ", ".join(f"{t:.2f}" for t in values))

    pulls, direct = times["pull"], times["direct"]
    persists = [min(c, d) for c, d in zip(times["cached"], direct, strict=True)] if direct else times["cached"]
    floors = [max(h, p) for h, p in zip(times["hash"], persists, strict=True)]
    base = min(a + b for a, b in parts)
    print(f"file: {size / MIB:.0f} MiB on loopback, {runs} rounds; cpus: {os.cpu_count()}")
    line("curl -o F URL && sha256sum F", f"{base:6.2f} s",
         "best; runs, curl+sha256sum: " + ", ".join(f"{a:.2f}+{b:.2f}" for a, b in parts))
    timing("provision model pull", pulls)
    timing("hashlib sha256 alone", times["hash"])
    timing("write + fdatasync, cached", times["cached"])
    if direct:
        timing("write + fdatasync, O_DIRECT", direct)
    timing("a 1 MiB pull (start-up etc.)", times["small"])
    disk_bound = sum(1 for h, p in zip(times["hash"], persists, strict=True) if p > h)
    line("one-pass floor", f"{statistics.median(floors):6.2f} s",
         f"median; each round the slower of hashing and the faster durable write: the disk in {disk_bound} of {runs}")
    line("ratio pull / (curl+sha256sum)", f"{min(pulls) / base:.2f}", "best against best; goal <= 0.6")
    # The verdict: the pulls' time over their rounds' floors, summed. On a disk whose speed strays by
    # a quarter from one run to the next (the VM's network disk: O_DIRECT persist 1.2-3.7 s per GiB
    # within minutes) the best pull against the best floor compares two outliers; the sums use every
    # round, and the interval says how far another set of rounds could put them.
    low, high = interval(pulls, floors)
    line("pull / floor, all rounds", f"{sum(pulls) / sum(floors):.2f}",
         f"summed; 90 % interval {low:.2f}-{high:.2f}; goal <= 1.1")
    paired = [p / f for p, f in zip(pulls, floors, strict=True)]
    line("pull / floor, round by round", f"{statistics.median(paired):.2f}",
         "median; runs: " + ", ".join(f"{r:.2f}" for r in paired))
    line("pull / floor, best of each", f"{min(pulls) / min(floors):.2f}", "the fastest pull over the fastest floor")
    share = statistics.median(times["small"]) / statistics.median(floors)
    line("1 MiB pull / floor", f"{share:.2f}", "medians: what a pull costs besides its stream")
    line("pull / hashlib alone", f"{sum(pulls) / sum(times['hash']):.2f}",
         "summed; reachable only where the disk outruns hashing")


if __name__ == "__main__":
    sys.exit(main())
