"""Every command against the bad-input table (tests/bad_input_cases.py), in a sandbox it may not harm.

Each case asserts the exact code and exit status, a `fix:` line, that nothing outside the
case's intended output changed (every file under the sandbox is hashed before and after: the
user's files, the model store, the state directory) and that the store is still consistent.
The counts in docs/bad-input.md are generated from the same run (``python -m
tests.cli.test_bad_input`` prints them) and checked here, so they cannot drift.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from provision import cli
from provision.core import errors
from provision.models import download
from provision.models import store as models
from tests.cli.bad_input_cases import CASES, DEFECTS, Case
from tests.models import models_http

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "bad-input.md"
BODY = models_http.gguf_bytes(256 * 1024, seed=3)
SHA = hashlib.sha256(BODY).hexdigest()
PATH = "/files/tiny.gguf"
EXIT = {cls.code: cls.exit_status for cls in errors.all_errors()}
FSIZE_LIMIT = 512 * 1024  # below tiny-llama's size: the synth write must fail half-way
ALWAYS_ALLOWED = ("cache/models/locks/*", "state/logs/*.log")  # lock files stay (core/locks.py); one log per command
VERDICTS = ("clear error", "safe success", "traceback", "wrong success", "data lost", "wrong answer")


# --- the sandbox ---------------------------------------------------------------------------------


def _synth_store(root: Path) -> None:
    models.Store(root=root / "cache" / "models", out=io.StringIO()).synth(models.SMOKE_MODEL)


def _ref(root: Path, name: str) -> Path:
    return root / "cache" / "models" / "refs" / f"{name}.json"


def _tiny_blob(root: Path) -> Path:
    return next((root / "cache" / "models" / "blobs").glob("sha256-*"))


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def _rebound_ref(root: Path) -> None:
    """What an unfixed `pull URL --name tiny-llama` left behind: a catalog name bound to other bytes."""
    blob = root / "cache" / "models" / "blobs" / f"sha256-{SHA}"
    _write(blob, BODY)
    blob.chmod(0o444)
    ref = {"name": "tiny-llama", "sha256": SHA, "size": len(BODY), "source": "https://127.0.0.1/x.gguf",
           "pinned": False, "pin_status": None}  # fmt: skip
    _ref(root, "tiny-llama").write_text(json.dumps(ref))


def _blob_damaged(root: Path) -> None:
    blob = _tiny_blob(root)
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    blob.chmod(0o444)


def _empty_store(root: Path) -> None:
    blob = _tiny_blob(root)
    blob.chmod(0o644)
    blob.unlink()
    _ref(root, "tiny-llama").unlink()


def _cache_is_file(root: Path) -> dict[str, str]:
    _write(root / "cachefile", "not a directory\n")
    return {"PROVISION_CACHE": str(root / "cachefile")}


def _fifo_containerfile(root: Path) -> None:
    (root / "work" / "fifo-dir").mkdir()
    os.mkfifo(root / "work" / "fifo-dir" / "Containerfile")


WRONG_FIELDS = {"name": "broken", "sha256": "zz", "size": -1, "source": "", "pinned": "yes", "pin_status": None}
SETUPS: dict[str, Callable[[Path], dict[str, str] | None]] = {
    "broken_catalog": lambda r: _write(r / "work" / "broken.yaml", "stacks: [\n  - {name: x\n"),
    "binary_catalog": lambda r: _write(r / "work" / "binary.yaml", b"\xff\xfe\x00stacks"),
    "our_render": lambda r: _write(r / "work" / "ours" / "Containerfile", "# Rendered by provision from x\nold\n"),
    "ref_not_utf8": lambda r: _write(_ref(r, "broken"), b'{"name": "\xff\xfe broken"}'),
    "ref_bad_json": lambda r: _write(_ref(r, "broken"), '{"name": "broken", '),
    "ref_wrong_fields": lambda r: _write(_ref(r, "broken"), json.dumps(WRONG_FIELDS)),
    "ref_name_mismatch": lambda r: _write(
        _ref(r, "broken"), _ref(r, "tiny-llama").read_text().replace('"tiny-llama"', '"other"')
    ),
    "rebound_ref": _rebound_ref,
    "blob_damaged": _blob_damaged,
    "empty_store": _empty_store,
    "cache_is_file": lambda r: _cache_is_file(r),
    "cache_under_file": lambda r: {"PROVISION_CACHE": str(r / "work" / "notes.txt" / "cache")},
    "ref_is_directory": lambda r: _ref(r, "dirref").mkdir(),
    "fifo": lambda r: os.mkfifo(r / "work" / "pipe"),
    "fifo_containerfile": lambda r: _fifo_containerfile(r),
}


def snapshot(root: Path) -> dict[str, str]:
    """Every file (and link) under ``root``: relative path -> content hash and mode."""
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif not path.is_file():  # a FIFO or socket: reading it would block
                out[rel] = f"special:{path.stat().st_mode:o}"
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() + f":{path.stat().st_mode:o}"
    return out


def store_problems(root: Path, case: Case) -> list[str]:
    problems = [f"half-written file {p.relative_to(root)}" for p in root.rglob("*.tmp")]
    store_root = root / "cache" / "models"
    if not store_root.is_dir():
        return problems
    if not any("partial" in c for c in case.changes):
        problems += [f"leftover {p.relative_to(root)}" for p in (store_root / "partial").glob("*")]
    good, _damaged = models.Store(root=store_root, out=io.StringIO()).scan()
    for ref in good:
        blob = store_root / "blobs" / f"sha256-{ref.sha256}"
        if not blob.exists():
            problems.append(f"ref {ref.name}: blob missing")
        elif "blob_damaged" not in case.setup and hashlib.sha256(blob.read_bytes()).hexdigest() != ref.sha256:
            problems.append(f"ref {ref.name}: blob does not match its sha256")
    return problems


# --- running one case --------------------------------------------------------------------------


@dataclass
class Outcome:
    case: Case
    status: int | str
    stdout: str
    stderr: str
    verdict: str = ""
    detail: list[str] = field(default_factory=list)


class Harness:
    """The fault server and a template store, shared by every case."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.server = models_http.start({PATH: BODY, "/page.html": b"<!doctype html><title>no</title>" * 50})
        self.template = base / "template"
        _synth_store(self.template)
        self.count = 0

    def close(self) -> None:
        models_http.stop(self.server)

    def sandbox(self) -> Path:
        self.count += 1
        root = self.base / f"case-{self.count}"
        shutil.copytree(self.template, root)
        _write(root / "work" / "Containerfile", "FROM scratch\n# my own Containerfile, not provision's\n")
        _write(root / "work" / "model.gguf", b"my model: precious bytes that are not even GGUF")
        _write(root / "work" / "notes.txt", "notes\n")
        (root / "state").mkdir()
        return root

    def fill(self, text: str) -> str:
        return text.format(url=self.server.url(PATH), base=self.server.base, sha=SHA, half=len(BODY) // 2)

    def run(self, case: Case) -> Outcome:
        root = self.sandbox()
        env = {"PROVISION_CACHE": str(root / "cache"), "PROVISION_STATE": str(root / "state")}
        for name in case.setup:
            env.update(SETUPS[name](root) or {})
        env.update({k: self.fill(v) for k, v in case.env.items()})
        argv = [self.fill(a) for a in case.argv]
        srv = self.server
        srv.requests.clear()
        srv.plans[:] = [self.fill(p) for p in case.plans]
        before = snapshot(root)
        try:
            if case.runner == "inprocess":
                status, out, err = _in_process(argv, env, root)
            else:
                status, out, err = _subprocess(argv, env, root, case.runner)
        finally:
            srv.release.set()
            srv.release, srv.paused = threading.Event(), threading.Event()
        outcome = Outcome(case, status, out, err)
        judge(outcome, root, before)
        return outcome


@contextlib.contextmanager
def _environment(env: dict[str, str], cwd: Path) -> Iterator[None]:
    saved, here, backoff = dict(os.environ), os.getcwd(), download.BACKOFF_S
    for key in ("HF_ENDPOINT", "PROVISION_STALL_S"):
        os.environ.pop(key, None)
    os.environ.update(env)
    os.chdir(cwd)
    download.BACKOFF_S = 0.01
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir(here)
        download.BACKOFF_S = backoff


def _in_process(argv: list[str], env: dict[str, str], root: Path) -> tuple[int | str, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status: int | str
    with _environment(env, root), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(argv)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - an escaped exception is exactly what the suite looks for
            status = "escaped"
            err.write(traceback.format_exc())
    return status, out.getvalue(), err.getvalue()


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


def _subprocess(argv: list[str], env: dict[str, str], root: Path, runner: str) -> tuple[int | str, str, str]:
    cmd = [sys.executable, "-m", "provision", *argv]
    full = {k: v for k, v in os.environ.items() if k not in ("HF_ENDPOINT", "PROVISION_STALL_S")}
    full.update(env, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    preexec = _limit_file_size if runner == "ulimit" else None
    if runner == "readonly":
        # A read-only filesystem over the cache, in a mount namespace of its own (nothing leaks out).
        script = 'mount -t tmpfs -o ro,size=1m tmpfs "$1" && shift && exec "$@"'
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", env["PROVISION_CACHE"], *cmd]
    done = subprocess.run(cmd, env=full, cwd=root, capture_output=True, text=True, timeout=120, preexec_fn=preexec)
    return done.returncode, done.stdout, done.stderr


def judge(o: Outcome, root: Path, before: dict[str, str]) -> None:
    case = o.case
    after = snapshot(root)
    allowed = (*ALWAYS_ALLOWED, *case.changes)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    lost = [p for p in changed if not any(fnmatch.fnmatch(p, pat) for pat in allowed)]
    codes = re.findall(r"^(E\d{3}): ", o.stderr, re.M)
    text = o.stdout + o.stderr
    if o.status in (errors.INTERNAL_ERROR_STATUS, "escaped") or "Traceback (most recent call last)" in text:
        o.verdict = "traceback"
    elif lost:
        o.verdict, o.detail = "data lost", [f"changed outside the intended output: {lost}"]
    elif case.code == "ok":
        problems = store_problems(root, case)
        marker_ok = case.out is None or case.out in text
        o.verdict = "safe success" if o.status == 0 and marker_ok and not problems else "wrong answer"
        o.detail = problems + ([] if marker_ok else [f"output lacks {case.out!r}"])
    elif o.status == 0:
        o.verdict = "wrong success"
    else:
        problems = store_problems(root, case)
        if not codes or codes[0] != case.code:
            problems.append(f"code {codes[:1]} instead of {case.code}")
        if o.status != EXIT[case.code]:
            problems.append(f"exit status {o.status} instead of {EXIT[case.code]}")
        if not re.search(r"^  fix: \S", o.stderr, re.M):
            problems.append("no fix: line")
        if case.json:
            try:
                shown = json.loads(o.stdout)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                shown = None
            if shown != case.code:
                problems.append(f"--json printed no JSON error with {case.code} (got {shown!r})")
        o.verdict = "wrong answer" if problems else "clear error"
        o.detail = problems


# --- the tests -----------------------------------------------------------------------------------

RESULTS: dict[str, Outcome] = {}
_harness: Harness | None = None


def harness_for(base: Path) -> Harness:
    global _harness
    if _harness is None:
        _harness = Harness(base)
    return _harness


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    global _harness
    h = harness_for(tmp_path_factory.mktemp("bad-input"))
    yield h
    h.close()
    _harness = None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(harness: Harness, case: Case) -> None:
    outcome = harness.run(case)
    RESULTS[case.id] = outcome
    want = "safe success" if case.code == "ok" else "clear error"
    assert outcome.verdict == want, (
        f"{case.id}: {outcome.verdict} {outcome.detail}\nexit {outcome.status}\n"
        f"stdout: {outcome.stdout[-1500:]}\nstderr: {outcome.stderr[-2500:]}"
    )


def test_the_table_is_big_and_covers_every_command_and_every_defect() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(CASES) >= 100
    commands = {c.argv[0] for c in CASES if c.argv}
    assert {"stacks", "image", "model", "host-tools", "launch", "run", "bench", "doctor", "ggml", "apir"} <= commands
    subcommands = {" ".join(c.argv[:2]) for c in CASES if c.argv[:1] in (("model",), ("image",))}
    for sub in ("model pull", "model list", "model verify", "model rm", "model path", "model synth",
                "image render", "image build"):  # fmt: skip
        assert sub in subcommands, sub
    covered = {c.defect for c in CASES if c.defect}
    assert set(DEFECTS) <= covered, set(DEFECTS) - covered


def summary(outcomes: list[Outcome]) -> str:
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.case.command, []).append(o)
    head = ["command", "tried", *VERDICTS]
    rows = [head, ["---"] * len(head)]
    for name in sorted(groups):
        got = groups[name]
        rows.append([f"`{name}`", str(len(got)), *(str(sum(o.verdict == v for o in got)) for v in VERDICTS)])
    rows.append(["**all**", str(len(outcomes)), *(str(sum(o.verdict == v for o in outcomes)) for v in VERDICTS)])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def doc_block() -> str:
    m = re.search(r"<!-- bad-input-counts[^>]*-->\n(.*?)\n<!-- /bad-input-counts -->", DOC.read_text(), re.S)
    assert m, f"{DOC} lost its bad-input-counts markers"
    return m.group(1)


def all_outcomes(base: Path) -> list[Outcome]:
    h = harness_for(base)
    return [RESULTS[c.id] if c.id in RESULTS else RESULTS.setdefault(c.id, h.run(c)) for c in CASES]


def test_docs_counts_are_the_suites_and_show_no_traceback_wrong_success_or_data_loss(harness: Harness) -> None:
    outcomes = all_outcomes(harness.base)  # the cases this run has not run yet (e.g. under -k) run now
    harmful = ("traceback", "wrong success", "data lost")
    bad = [(o.case.id, o.verdict, o.detail) for o in outcomes if o.verdict in harmful]
    assert bad == []
    assert doc_block() == summary(outcomes), "run: python -m tests.cli.test_bad_input, and paste its table"


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(summary(all_outcomes(Path(tmp))))
        assert _harness is not None
        _harness.close()
