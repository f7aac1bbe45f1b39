#!/usr/bin/env python3
"""The Venus route without a VM: the same llama-bench natively and through Venus over vtest (issue 40).

One virgl_test_server --venus (provision/hosts/linux/vtest/venus.py) serves every client of the run.
The same llama.cpp build (sid's llama.cpp-tools + libggml0-backend-vulkan, the llama-linux
guest's packages) runs natively on the host's Vulkan driver and through Mesa's venus driver:
llama-bench pp and tg, alternately, then a greedy llama-completion each way, whose text must be
the same (the gate: correctness only). Each run's one device is checked (driver "venus" on the
target's device through Venus, the target's own driver natively): no CPU fallback is measured.

Per token (tg) and per prompt token (pp), from a run with 1 and one with R repetitions, the
difference over (R-1) x tokens: wall time, CPU time of the client, the vtest server and the
render server, and the read/write system calls of each (the socket's round trips). With
``--vn-perf`` tg runs again through Venus with each VN_PERF flag, to see which of the driver's
own shortcuts carry the cost.

  python bench/venus_vtest.py                               # here: the host-tools chroot, lavapipe
  python bench/venus_vtest.py --stage DIR                   # make a tree of the programs for another host
  python bench/venus_vtest.py --tree DIR --target nvidia --model M.gguf -p 512 -n 128   # the lent H200
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from provision.cli.output import table  # noqa: E402
from provision.core.errors import (  # noqa: E402
    BenchGateFailed,
    HostToolsMissing,
    InvalidValue,
    ProvisionError,
    exit_as_cli,
)
from provision.hosts.linux.vtest import venus as vtest  # noqa: E402

PROMPT = "t1 t2 t3"
FENCE_PROBE = REPO / "checks" / "venus-vtest" / "fence-wait.c"
FENCE_PROGRAM = "usr/bin/krun-fence-wait"  # where a staged tree keeps it
SERVER_LOG = "vtest-server.log"  # in the work directory
ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EVAL = re.compile(r"\beval time =\s+[\d.]+ ms /\s+(\d+) runs")
TICK = os.sysconf("SC_CLK_TCK")
# x86-64 system call numbers a waiting thread sits in (/proc/PID/task/TID/syscall's first field).
SYSCALLS = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 24: "sched_yield", 35: "nanosleep", 44: "sendto",
            45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
            271: "ppoll", 281: "epoll_pwait"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Sampler:
    """CPU time and read/write syscalls of a set of processes, polled while they run (the render
    server's per-client worker exits with its client, so its last values are kept)."""

    def __init__(self, roots: Mapping[str, int]) -> None:
        self.roots = dict(roots)
        self.last: dict[int, tuple[str, float, int]] = {}
        self.role: dict[int, str] = {}
        # Where each thread of each role is at each sample: running, or the system call it waits in
        # (a poor man's profiler: no perf on the lent machine).
        self.states: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._fast = threading.Thread(target=self._sample_loop, daemon=True)

    @staticmethod
    def _read(pid: int) -> tuple[int, float, int] | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        except (OSError, ValueError):
            return None
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(io["syscr"]) + int(io["syscw"])

    def _scan(self) -> None:
        table_: dict[int, tuple[int, float, int]] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                r = self._read(int(d.name))
                if r is not None:
                    table_[int(d.name)] = r
        role = {pid: name for name, pid in self.roots.items()}
        changed = True
        while changed:  # descendants take their root's role (the render server's workers: "render")
            changed = False
            for pid, (ppid, _, _) in table_.items():
                if pid not in role and ppid in role:
                    role[pid] = "render" if role[ppid] == "server" else role[ppid]
                    changed = True
        for pid, name in role.items():
            if pid in table_:
                self.last[pid] = (name, table_[pid][1], table_[pid][2])
        self.role = {pid: name for pid, name in role.items() if pid in table_}

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._scan()
            self._stop.wait(0.05)

    def _sample(self) -> None:
        for pid, name in list(self.role.items()):
            r = self._read(pid)  # the totals too: a client's last values before it exits
            if r is not None:
                self.last[pid] = (name, r[1], r[2])
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            counts = self.states.setdefault(name, {})
            for tid in tids:
                try:
                    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                    state = stat[stat.rindex(")") + 2]
                    what = "running" if state == "R" else Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]
                except (OSError, ValueError, IndexError):
                    continue
                if what.isdigit():
                    what = SYSCALLS.get(int(what), f"syscall {what}")
                counts[what] = counts.get(what, 0) + 1

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.002)

    def __enter__(self) -> Sampler:
        self._scan()
        self.start = dict(self.last)
        self._thread.start()
        self._fast.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._fast.join()

    def totals(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for pid, (name, cpu, calls) in self.last.items():
            c0, n0 = self.start.get(pid, (name, 0.0, 0))[1:]
            row = out.setdefault(name, {"cpu_s": 0.0, "syscalls": 0})
            row["cpu_s"] += cpu - c0
            row["syscalls"] += calls - n0
        return out


class Run:
    def __init__(self, place: vtest.Place, target: str, model: Path, log_dir: Path, timeout: float = 600) -> None:
        self.place, self.target, self.model, self.log_dir = place, target, model, log_dir
        self.timeout = timeout
        self.extra_env: dict[str, str] = {}  # ggml settings for both sides alike (--ggml-env)
        self.server: subprocess.Popen[bytes] | None = None

    def start_server(self) -> None:
        sock = self.place.work / vtest.SOCKET
        sock.unlink(missing_ok=True)
        argv, env = self.place.command(vtest.SERVER, vtest.server_args(self.place), vtest.server_env(self.place))
        self.server_log = (self.log_dir / SERVER_LOG).open("wb")
        self.server = subprocess.Popen(argv, env=env, stdout=self.server_log, stderr=subprocess.STDOUT,
                                       cwd=self.place.work, start_new_session=True)
        for _ in range(100):
            if sock.exists() or self.server.poll() is not None:
                break
            time.sleep(0.1)
        if not sock.exists():
            raise HostToolsMissing(f"virgl_test_server made no socket (exit {self.server.poll()}): "
                                   f"{(self.log_dir / 'vtest-server.log').read_text()[-1500:]}",
                                   fix="read the server log; the render server must start (RENDER_SERVER_EXEC_PATH)")

    def stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()

    def client(self, program: str, args: Sequence[str], via_venus: bool, timeout: float, vn_perf: str = "",
               sample: bool = False, llama: bool = True) -> dict[str, Any]:
        """One client process, waited for; ``llama``: a llama.cpp program, whose device lines are checked
        here (others check what they print themselves)."""
        if via_venus and (self.server is None or self.server.poll() is not None):
            raise HostToolsMissing(f"the vtest server is gone: {server_tail(self.log_dir)[-1500:]}",
                                   fix="read the server log named above")
        env = {**self.extra_env, **vtest.client_env(self.place, via_venus, vn_perf)}
        argv, full_env = self.place.command(program, args, env)
        t = time.monotonic()
        # A synthetic model's tokens need not be valid UTF-8: compared as replaced text, both sides alike.
        proc = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                encoding="utf-8", errors="replace", cwd=self.place.cwd())
        roots = {"client": proc.pid}
        if via_venus and self.server is not None:
            roots["server"] = self.server.pid
        sampler = Sampler(roots) if sample else None
        if sampler:
            sampler.__enter__()
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise HostToolsMissing(
                f"{' '.join(argv[-12:])} did not finish in {timeout:.0f} s ({'Venus' if via_venus else 'native'}):"
                f" {err[-1500:]}\nserver: {(self.log_dir / 'vtest-server.log').read_text()[-1500:]}",
                fix="read the vtest server's log; a dispatch error there leaves the client waiting") from None
        finally:
            if sampler:
                sampler.__exit__()
        wall = time.monotonic() - t
        if proc.returncode != 0:
            raise HostToolsMissing(f"{program} exited {proc.returncode} ({'Venus' if via_venus else 'native'}): "
                                   f"{err[-2000:]}", fix="read the error above and the vtest server's log")
        dev = vtest.expect(err, self.target, via_venus) if llama else vtest.Device(0, "", "")
        return {"stdout": out, "stderr": err, "wall_s": wall, "device": dev.name, "driver": dev.driver,
                "profile": sampler.totals() if sampler else {}, "states": sampler.states if sampler else {}}

    def bench(self, test: Sequence[str], via_venus: bool, reps: int, vn_perf: str = "",
              sample: bool = False) -> dict[str, Any]:
        args = ["-m", self.place.path(self.model), "-dev", "Vulkan0", "-ngl", "99", *test, "-r", str(reps),
                "-o", "jsonl"]
        r = self.client(vtest.LLAMA_BENCH, args, via_venus, self.timeout, vn_perf, sample)
        recs = [json.loads(line) for line in r["stdout"].splitlines() if line.startswith("{")]
        if not recs:
            raise HostToolsMissing(f"llama-bench wrote no record: {r['stderr'][-1500:]}", fix="read the error above")
        rec = recs[-1]
        return {"ts": round(float(rec["avg_ts"]), 2), "sd": round(float(rec["stddev_ts"]), 2),
                "samples_ts": rec.get("samples_ts"), "device": r["device"], "driver": r["driver"],
                "gpu_info": rec.get("gpu_info"), "backends": rec.get("backends"), "wall_s": round(r["wall_s"], 3),
                "profile": r["profile"], "states": r["states"]}

    def greedy(self, via_venus: bool, n: int, attempts: int = 3) -> dict[str, Any]:
        """llama-completion's greedy text. Its log (the text and the timings) is written by a thread of
        its own; now and then the process exits, status 0, before that thread wrote the last lines
        (seen through Venus, 1 run in 7 on a loaded machine: the timings missing, once the last token
        too). A run whose log lacks its closing timings says nothing about the text, so it runs again,
        ``attempts`` times at most; the report keeps how many it took."""
        args = ["-m", self.place.path(self.model), "-dev", "Vulkan0", "-ngl", "99", "-p", PROMPT, "-n", str(n),
                "--temp", "0", "-s", "1", "--no-warmup", "-no-cnv", "-v"]  # -v: the device it loads onto
        tried = 0
        while tried < attempts:
            tried += 1
            r = self.client(vtest.COMPLETION, args, via_venus, self.timeout)
            runs = [int(x) for x in _EVAL.findall(r["stderr"])]
            if runs:
                break
        text = ANSI.sub("", r["stdout"]).strip()
        # The stderr's end goes with it: a run that ends short says why there (the gate quotes it).
        return {"text": text, "eval_runs": runs[-1] if runs else 0, "device": r["device"], "driver": r["driver"],
                "attempts": tried, "stderr_tail": ANSI.sub("", r["stderr"])[-1200:]}

    def fence_wait(self, program: str, via_venus: bool, iterations: int) -> dict[str, Any]:
        """checks/venus-vtest/fence-wait: one small transfer submitted and waited for, blocking and by
        polling, medians in microseconds; the device it names checked as llama.cpp's is."""
        r = self.client(program, [str(iterations)], via_venus, self.timeout, llama=False)
        try:
            rec: dict[str, Any] = json.loads(r["stdout"].strip().splitlines()[-1])
            dev = vtest.Device(0, str(rec["device"]), str(rec["driver"]))
        except (IndexError, ValueError, KeyError, TypeError):
            raise HostToolsMissing(f"fence-wait printed no report: {r['stdout'][-500:]!r} {r['stderr'][-1000:]}",
                                   fix=f"rebuild it from {FENCE_PROBE.relative_to(REPO)}") from None
        vtest.check(dev, self.target, via_venus)
        return rec


# The server's line when a client leaves (patches/virglrenderer/vtest-count-commands.patch).
_COMMANDS = re.compile(r"^client: commands((?: [A-Z0-9_]+=\d+)*)$", re.M)


def client_commands(server_log: str) -> list[dict[str, int]]:
    """Each departed client's vtest commands, by name, in the order they left."""
    return [{k: int(v) for k, v in (item.split("=") for item in m.group(1).split())}
            for m in _COMMANDS.finditer(server_log)]


def count_commands(run: Run, tg: Sequence[str], wait_s: float = 10.0) -> dict[str, float]:
    """vtest commands per decoded token through Venus: llama-bench tg at N and 3N tokens (one
    repetition each), each client's commands as the server counted them when it left, the
    difference over 2N."""
    n = int(tg[tg.index("-n") + 1])
    log_file = run.log_dir / SERVER_LOG
    got = {}
    for tokens in (n, 3 * n):
        before = len(client_commands(log_file.read_text(errors="replace")))
        run.bench(["-p", "0", "-n", str(tokens)], True, 1)
        deadline = time.monotonic() + wait_s  # the server sees the disconnect on its next poll
        while len(seen := client_commands(log_file.read_text(errors="replace"))) <= before:
            if time.monotonic() > deadline:
                raise HostToolsMissing(f"the vtest server logged no command counts for the tg{tokens} client "
                                       f"in {wait_s:.0f} s: {server_tail(run.log_dir)[-1500:]}",
                                       fix="the server needs vtest-count-commands.patch and VTEST_COUNT_COMMANDS=1")
            time.sleep(0.05)
        got[tokens] = seen[before]
    names = sorted(set(got[n]) | set(got[3 * n]))
    per = {k: round((got[3 * n].get(k, 0) - got[n].get(k, 0)) / (2 * n), 2) for k in names}
    return {k: v for k, v in per.items() if v}  # the setup's commands (once per client) cancel out


def build_fence_probe(out: Path) -> Path:
    """The probe, compiled here against the system's Vulkan headers (libvulkan-dev); it runs inside
    the sid chroot or a staged tree, whose glibc is newer."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not Path("/usr/include/vulkan/vulkan.h").is_file():
        raise HostToolsMissing("the fence probe needs a C compiler and the Vulkan headers",
                               fix="bash scripts/setup-debian (gcc, libvulkan-dev)")
    tmp = out.with_name(out.name + ".partial")
    proc = subprocess.run([cc, "-O2", "-Wall", "-o", str(tmp), str(FENCE_PROBE), "-lvulkan"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise HostToolsMissing(f"compiling {FENCE_PROBE.name} failed: {proc.stderr[-1500:]}",
                               fix="read the compiler's error above")
    os.replace(tmp, out)
    return out


def per_token(one: Mapping[str, Any], many: Mapping[str, Any], tokens: int) -> dict[str, Any]:
    """What ``tokens`` more tokens cost (the R-repetition run minus the 1-repetition run), per token."""
    out: dict[str, Any] = {"wall_us": round((many["wall_s"] - one["wall_s"]) / tokens * 1e6, 1)}
    for name, row in many["profile"].items():
        o = one["profile"].get(name, {"cpu_s": 0.0, "syscalls": 0})
        out[name] = {"cpu_us": round((row["cpu_s"] - o["cpu_s"]) / tokens * 1e6, 1),
                     "syscalls": round((row["syscalls"] - o["syscalls"]) / tokens, 2)}
    # Thread samples of the extra tokens alone (the longer run's minus the shorter's), by role.
    out["samples"] = {role: {k: n - one.get("states", {}).get(role, {}).get(k, 0) for k, n in sorted(
        states.items(), key=lambda kv: -kv[1])} for role, states in many.get("states", {}).items()}
    return out


def measure(run: Run, tests: Mapping[str, list[str]], reps: int, vn_perf: Sequence[str],
            results: dict[str, Any]) -> dict[str, Any]:
    """Fills ``results`` as it goes, so a failure later keeps what was measured."""
    for test, argv in tests.items():
        tokens = int(argv[argv.index("-n") + 1]) or int(argv[argv.index("-p") + 1])
        results[test] = {}
        for name, venus in (("native", False), ("venus", True)):  # alternately: both see the same load
            one = run.bench(argv, venus, 1, sample=True)
            many = run.bench(argv, venus, reps, sample=True)
            many["per_token"] = per_token(one, many, (reps - 1) * tokens)
            results[test][name] = many
            log(f"{test} {name}: {many['ts']} t/s on {many['device']} ({many['driver']}), "
                f"per token {many['per_token']}")
        n, v = results[test]["native"]["ts"], results[test]["venus"]["ts"]
        results[test]["ratio"] = round(v / n, 3) if n else None
    if vn_perf:
        tg = next((t for t in tests if t.startswith("tg")), None)
        if tg is not None:
            for flag in vn_perf:
                r = run.bench(tests[tg], True, reps, vn_perf=flag)
                results[tg].setdefault("vn_perf", {})[flag] = r["ts"]
                log(f"{tg} venus VN_PERF={flag}: {r['ts']} t/s")
    return results


def render(report: Mapping[str, Any]) -> str:
    rows = []
    for test, r in report["results"].items():
        n, v = r["native"], r["venus"]
        rows.append([test, f"{n['ts']} ± {n['sd']}", f"{v['ts']} ± {v['sd']}", r["ratio"],
                     n["per_token"]["wall_us"], v["per_token"]["wall_us"]])
    lines = [f"Venus over vtest vs native, {report['target']}: native {report['native_device']}, "
             f"Venus {report['venus_device']}; model {Path(report['model']).name}",
             table(["TEST", "NATIVE T/S", "VENUS T/S", "RATIO", "NATIVE US/TOK", "VENUS US/TOK"], rows)]
    for test, r in report["results"].items():
        prof = r["venus"]["per_token"]
        lines.append(f"{test} through Venus, per token: " + ", ".join(
            f"{k} {v['cpu_us']} us CPU / {v['syscalls']} syscalls" for k, v in prof.items()
            if isinstance(v, dict) and "cpu_us" in v))
        for role, states in prof.get("samples", {}).items():
            lines.append(f"  {role} threads sampled: " + ", ".join(f"{k} {n}" for k, n in list(states.items())[:6]))
        if "commands_per_token" in r["venus"]:
            lines.append(f"{test} through Venus, vtest commands per token: " + ", ".join(
                f"{k} {v}" for k, v in r["venus"]["commands_per_token"].items() if v))
        if "vn_perf" in r:
            lines.append(f"{test} VN_PERF: " + ", ".join(f"{k} {v} t/s" for k, v in r["vn_perf"].items()))
    f = report.get("fence_wait") or {}
    if f:
        lines.append("one small transfer, submitted and waited for (median us): " + "; ".join(
            f"{name} {r['wait_us']} blocking, {r['poll_us']} polling" for name, r in f.items()))
    g = report["greedy"]
    lines.append(f"greedy {g['tokens']} tokens: {'same' if g['same'] else 'DIFFERENT'} text natively and through Venus")
    return "\n".join(lines)


def server_root(tarball: Path | None) -> Path:
    """The host-tools chroot with the patched vtest server built in it."""
    from provision.core import pins
    from provision.hosts.linux.vtest import server as vtest_server

    if tarball is None:
        name = pins.default().require(vtest_server.PIN, purpose="the vtest server")["upstream_tarball"]
        tarball = REPO.parent / "shared" / "upstream" / str(name)
    if not tarball.is_file():
        raise InvalidValue(f"--virgl-tar {tarball}: no such file",
                           fix="name the pinned virglrenderer tree's archive (pins.json virglrenderer-vtest)")
    return vtest_server.make(tarball.resolve(), log=log)


def server_tail(work: Path) -> str:
    f = work / SERVER_LOG
    return f.read_text(errors="replace")[-4000:] if f.exists() else ""


def write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--target", choices=sorted(vtest.TARGETS), default="lavapipe")
    p.add_argument("--tree", type=Path, help="a staged tree (--stage) instead of the host-tools chroot")
    p.add_argument("--stage", type=Path, metavar="DIR", help="only make a tree of the programs in DIR and exit")
    p.add_argument("--native-icd", help="the host driver's Vulkan manifest (--tree; default: VK_DRIVER_FILES)")
    p.add_argument("--model", type=Path, help="GGUF (default: the store's tiny-llama)")
    p.add_argument("-p", "--n-prompt", type=int, default=64)
    p.add_argument("-n", "--n-gen", type=int, default=16)
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("--greedy", type=int, default=12, help="tokens of the greedy run")
    p.add_argument("--vn-perf", default="", help="VN_PERF flags, comma-separated, each a tg run through Venus")
    p.add_argument("--virgl-tar", type=Path, help="the pinned virglrenderer tree (default: the shared upstream copy)")
    p.add_argument("--work", type=Path, help="socket and logs (default: a temporary directory)")
    p.add_argument("--ggml-env", action="append", default=[], metavar="GGML_VK_NAME=VALUE",
                   help="a ggml-vulkan setting for both sides, e.g. GGML_VK_DISABLE_HOST_VISIBLE_VIDMEM=1")
    p.add_argument("--client-timeout", type=float, default=600, help="seconds one llama.cpp process may take")
    p.add_argument("--commands", action="store_true",
                   help="count the vtest commands per decoded token through Venus, as the server received them")
    p.add_argument("--fence-iterations", type=int, default=300,
                   help="small transfers the fence probe waits for each way (checks/venus-vtest/fence-wait.c)")
    p.add_argument("--json", type=Path, help="write the report here too")
    args = p.parse_args(argv)
    if args.repetitions < 2:
        raise InvalidValue("--repetitions must be at least 2 (the per-token cost is a difference)",
                           fix="-r 3 or more")
    if not 2 <= args.fence_iterations <= 100000:
        raise InvalidValue(f"--fence-iterations {args.fence_iterations}: must be 2..100000",
                           fix="--fence-iterations 300")
    if min(args.n_prompt, args.n_gen, args.greedy) < 1:
        raise InvalidValue("-p, -n and --greedy must be at least 1", fix="-p 512 -n 128 --greedy 12")
    flags = [f for f in args.vn_perf.split(",") if f]
    if any(not re.fullmatch(r"[a-z_]+", f) for f in flags):
        raise InvalidValue(f"--vn-perf {args.vn_perf!r}: flags are lower-case words (no_async_queue_submit,…)",
                           fix="--vn-perf no_async_queue_submit,no_cmd_batching")
    extra = {}
    for item in args.ggml_env:
        name, _, value = item.partition("=")
        if not re.fullmatch(r"GGML_VK_[A-Z0-9_]+", name) or not re.fullmatch(r"[A-Za-z0-9_.,-]*", value):
            raise InvalidValue(f"--ggml-env {item!r}: not GGML_VK_NAME=VALUE", fix="--ggml-env GGML_VK_DISABLE_F16=1")
        extra[name] = value
    if args.stage is not None:
        root = server_root(args.virgl_tar)
        with tempfile.TemporaryDirectory(prefix="fence-probe-") as tmp:
            probe = build_fence_probe(Path(tmp) / "fence-wait")
            vtest.stage(root, args.stage.resolve(), log, extra={FENCE_PROGRAM: probe})
        return 0
    if args.model is None:
        from provision.models import store

        args.model = store.ensure("tiny-llama")
    model = args.model.resolve()
    if not model.is_file():
        raise InvalidValue(f"--model {args.model}: no such file", fix="name a GGUF file")
    with tempfile.TemporaryDirectory(prefix="venus-vtest-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        if args.tree is not None:
            icd = args.native_icd or os.environ.get("VK_DRIVER_FILES", "")
            if not icd or not Path(icd).is_file():
                raise InvalidValue(f"--native-icd {icd!r}: no such manifest",
                                   fix="name the host driver's ICD JSON, e.g. /usr/share/vulkan/icd.d/nvidia_icd.json")
            place = vtest.tree_place(args.tree.resolve(), work, model.parent, icd, os.environ)
        else:
            place = vtest.chroot_place(server_root(args.virgl_tar), work, model.parent, args.target)
        if place.chroot:  # the work directory is the chroot's /vtest
            build_fence_probe(work / "fence-wait")
            probe = "vtest/fence-wait"
        else:
            probe = FENCE_PROGRAM
            if not (place.root / probe).is_file():
                raise HostToolsMissing(f"{place.root} has no {probe} (staged before the fence probe existed)",
                                       fix="stage the tree again with `bench/venus_vtest.py --stage DIR`")
        run = Run(place, args.target, model, work, args.client_timeout)
        run.extra_env = extra
        results: dict[str, Any] = {}
        fence: dict[str, Any] = {}
        greedy: dict[str, Any] = {}
        try:
            run.start_server()
            tests = {f"pp{args.n_prompt}": ["-p", str(args.n_prompt), "-n", "0"],
                     f"tg{args.n_gen}": ["-p", "0", "-n", str(args.n_gen)]}
            for name, venus in (("native", False), ("venus", True)):
                fence[name] = run.fence_wait(probe, venus, args.fence_iterations)
                log(f"one small transfer {name}: waited for {fence[name]['wait_us']} us blocking, "
                    f"{fence[name]['poll_us']} us polling (medians of {args.fence_iterations})")
            measure(run, tests, args.repetitions, flags, results)
            if args.commands:
                tg = f"tg{args.n_gen}"
                per = count_commands(run, tests[tg])
                results[tg]["venus"]["commands_per_token"] = per
                log(f"{tg} through Venus, vtest commands per token: {per}")
            for name, venus in (("native", False), ("venus", True)):
                greedy[name] = run.greedy(venus, args.greedy)
        except ProvisionError as exc:
            if args.json:  # what was measured before the failure, with the failure
                write_whole(args.json, json.dumps({"target": args.target, "model": str(model), "results": results,
                                                   "greedy": greedy, "fence_wait": fence,
                                                   "error": exc.as_dict(), "server_log_tail":
                                                   server_tail(work)}, indent=1) + "\n")
            raise
        finally:
            run.stop_server()
        server_log = server_tail(work)
    first = next(iter(results.values()))
    same = greedy["native"]["text"] == greedy["venus"]["text"]
    report = {"target": args.target, "model": str(model), "repetitions": args.repetitions, "ggml_env": extra,
              "native_device": first["native"]["device"], "venus_device": first["venus"]["device"],
              "results": results, "fence_wait": fence,
              "greedy": {"tokens": args.greedy, "prompt": PROMPT, "same": same, **greedy},
              "server_log_tail": server_log}
    print(render(report))
    if args.json:
        write_whole(args.json, json.dumps(report, indent=1) + "\n")
    generated = min(greedy["native"]["eval_runs"], greedy["venus"]["eval_runs"])
    if not same or generated < 1 or len(greedy["native"]["text"]) <= len(PROMPT):
        nat, ven = greedy["native"], greedy["venus"]
        raise BenchGateFailed(f"greedy text natively {nat['text']!r} ({nat['eval_runs']} evals, run "
                              f"{nat['attempts']}x), through Venus {ven['text']!r} ({ven['eval_runs']} evals, run "
                              f"{ven['attempts']}x; 0 evals: the log ended before its timings)"
                              f"\nnative stderr ends: {greedy['native']['stderr_tail']}"
                              f"\nVenus stderr ends: {greedy['venus']['stderr_tail']}",
                              fix="the same build and model must give the same greedy tokens; compare the "
                              "devices named above")
    return 0


if __name__ == "__main__":
    exit_as_cli(main)
