"""The model store against a real HTTP server on loopback: verified pulls, resume, retries, locks."""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision import cli
from provision.adapters import http as web
from provision.core import errors
from provision.core.pins import default as default_pins
from provision.core.progress import Progress
from provision.models import download, pipeline
from provision.models import store as models
from provision.models.refs import check_name, resolve
from tests.models import models_http

SIZE = 4 * 1024 * 1024
BODY = models_http.gguf_bytes(SIZE)
SHA = hashlib.sha256(BODY).hexdigest()
PATH = "/files/tiny.gguf"


@pytest.fixture
def cache(empty_cache: Path, monkeypatch) -> Path:
    monkeypatch.setattr(download, "BACKOFF_S", 0.01)
    return empty_cache / "models"


@pytest.fixture
def server():
    srv = models_http.start({PATH: BODY, "/page.html": b"<!doctype html><title>nope</title>" * 100})
    yield srv
    models_http.stop(srv)


def stored(cache: Path) -> dict[str, list[str]]:
    return {
        d: sorted(p.name for p in (cache / d).iterdir()) for d in ("blobs", "refs", "partial") if (cache / d).exists()
    }


def pull(*args: str) -> int:
    return cli.main(["model", "pull", *args])


def env_for(cache: Path) -> dict[str, str]:
    return {**os.environ, "PROVISION_CACHE": str(cache.parent), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


# --- happy path and verification ---------------------------------------------------------------


def test_pull_verifies_and_stores_content_addressed_with_a_name_ref(cache, server, capsys):
    assert pull(server.url(PATH), "--sha256", SHA, "--name", "tiny") == 0
    blob = cache / "blobs" / f"sha256-{SHA}"
    assert blob.read_bytes() == BODY
    assert blob.stat().st_mode & 0o222 == 0  # read-only
    assert stored(cache)["partial"] == []
    ref = json.loads((cache / "refs" / "tiny.json").read_text())
    assert ref["sha256"] == SHA and ref["size"] == SIZE and ref["pinned"] is True
    capsys.readouterr()
    assert cli.main(["model", "path", "tiny"]) == 0
    assert capsys.readouterr().out.strip() == str(blob)
    assert cli.main(["model", "verify", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"][0]["ok"] is True


def test_progress_is_plain_lines_with_rate_and_eta_when_not_a_tty(cache, server, capsys):
    server.delay_per_chunk = 0.002
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "MiB/s" in line]
    assert any("ETA" in line and "%" in line for line in lines), err
    assert "\r" not in err


def test_second_pull_is_served_from_the_store(cache, server, capsys):
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    capsys.readouterr()
    assert pull(server.url(PATH), "--sha256", SHA, "--json") == 0
    report = json.loads(capsys.readouterr().out)["data"]
    assert report["reused"] is True and report["fetched_bytes"] == 0
    assert len(server.requests) == 1


def test_a_damaged_blob_of_the_wrong_size_is_fetched_again_and_replaced(cache, server):
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    blob = cache / "blobs" / f"sha256-{SHA}"
    blob.chmod(0o644)
    blob.write_bytes(BODY[: SIZE // 2])
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    assert len(server.body_requests()) == 2 and blob.read_bytes() == BODY


def test_hash_mismatch_promotes_nothing_and_exits_with_e011(cache, server, capsys):
    wrong = hashlib.sha256(b"something else").hexdigest()
    status = pull(server.url(PATH), "--sha256", wrong)
    err = capsys.readouterr().err
    assert status == errors.ModelHashMismatch.exit_status == 21
    assert "E011" in err and SHA in err and wrong in err
    assert stored(cache) == {"blobs": [], "refs": [], "partial": []}


def test_unpinned_url_records_the_computed_hash(cache, server, capsys):
    assert pull(server.url(PATH)) == 0
    assert "no sha256 pinned" in capsys.readouterr().err
    ref = json.loads((cache / "refs" / "tiny.json").read_text())
    assert ref["sha256"] == SHA and ref["pinned"] is False


def test_a_file_without_gguf_magic_is_refused(cache, server, capsys):
    assert pull(server.url("/page.html"), "--name", "page") == errors.NotGguf.exit_status
    assert "E015" in capsys.readouterr().err
    assert stored(cache) == {"blobs": [], "refs": [], "partial": []}


# --- HTTP failures -------------------------------------------------------------------------------


def test_404_fails_at_once_with_e012(cache, server, capsys):
    assert pull(server.url("/missing.gguf"), "--sha256", SHA) == errors.DownloadFailed.exit_status
    assert "HTTP 404" in capsys.readouterr().err
    assert len(server.requests) == 1  # a 404 is not retried
    assert stored(cache)["blobs"] == []


def test_500_then_200_retries_and_succeeds(cache, server):
    server.plans = ["status:500", "status:503"]
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    assert [r.status for r in server.requests] == [500, 503, 200]


def test_persistent_500_gives_up_with_e012(cache, server, capsys):
    server.plans = ["status:500"] * 10
    assert pull(server.url(PATH), "--sha256", SHA) == errors.DownloadFailed.exit_status
    assert "HTTP 500" in capsys.readouterr().err
    assert len(server.requests) == download.MAX_ATTEMPTS


def test_truncated_body_is_resumed_with_range(cache, server):
    server.plans = [f"truncate_at:{SIZE // 3}"]
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    first, second = server.requests
    assert first.sent == SIZE // 3
    assert second.range == f"bytes={SIZE // 3}-" and second.if_range == server.etag and second.status == 206
    assert server.sent_total() == SIZE


def test_body_that_always_ends_early_fails_and_promotes_nothing(cache, server, capsys):
    server.plans = [f"truncate_at:{SIZE // 2}"] * 20
    assert pull(server.url(PATH), "--sha256", SHA) == errors.DownloadFailed.exit_status
    err = capsys.readouterr().err
    assert "E012" in err and "resumes" in err
    assert stored(cache)["blobs"] == [] and stored(cache)["refs"] == []


def test_connection_reset_mid_body_resumes_with_range_and_if_range(cache, server):
    server.plans = [f"reset_at:{SIZE // 2}"]
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    first, second = server.requests
    assert first.range is None
    start = int(second.range.removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= SIZE // 2  # bytes still in the socket buffer when the RST came are lost
    assert second.if_range == server.etag and second.status == 206
    assert (cache / "blobs" / f"sha256-{SHA}").read_bytes() == BODY


def test_stalled_body_hits_the_stall_timeout_and_resumes(cache, server, monkeypatch):
    monkeypatch.setenv("PROVISION_STALL_S", "0.3")
    server.plans = [f"pause_at:{SIZE // 2}"]  # stalls until released (at teardown)
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    assert server.requests[1].range == f"bytes={SIZE // 2}-" and server.requests[1].status == 206


def test_server_ignoring_range_restarts_from_zero(cache, server, capsys):
    server.plans = [f"reset_at:{SIZE // 2}", "ignore_range"]
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    second = server.requests[1]
    assert second.range is not None and second.status == 200 and second.sent == SIZE
    assert "starting from 0" in capsys.readouterr().err
    assert (cache / "blobs" / f"sha256-{SHA}").read_bytes() == BODY


def test_server_restarting_from_zero_and_closing_halfway_ends_in_e012_naming_it(cache, server, capsys):
    server.plans = [f"restart_close:{SIZE // 2}"] * 50
    assert pull(server.url(PATH), "--sha256", SHA) == errors.DownloadFailed.exit_status
    err = capsys.readouterr().err
    assert len(server.requests) == 1 + download.MAX_ATTEMPTS  # one attempt made progress, then 5 did not
    assert "starting from 0" in err and f"connection closed after byte {SIZE // 2} of {SIZE} (x6)" in err
    assert stored(cache)["blobs"] == [] and stored(cache)["refs"] == []


def test_a_206_from_byte_0_is_a_restart_and_completes_when_whole(cache, server, capsys):
    server.plans = [f"truncate_at:{SIZE // 2}", "from_zero"]
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    assert server.requests[1].range == f"bytes={SIZE // 2}-" and server.requests[1].sent == SIZE
    assert "from byte 0; starting from 0" in capsys.readouterr().err
    assert (cache / "blobs" / f"sha256-{SHA}").read_bytes() == BODY


def test_a_wrong_content_range_is_a_failed_attempt_and_the_partial_is_kept(cache, server, capsys):
    server.plans = [f"truncate_at:{SIZE // 2}"] + ["wrong_range"] * 10
    assert pull(server.url(PATH), "--sha256", SHA) == errors.DownloadFailed.exit_status
    assert "wrong Content-Range" in capsys.readouterr().err
    assert (cache / "partial" / f"{SHA}.partial").read_bytes() == BODY[: SIZE // 2]
    server.plans.clear()  # the server mends its ways
    assert pull(server.url(PATH), "--sha256", SHA) == 0  # and the next pull resumes from the partial
    assert server.requests[-1].range == f"bytes={SIZE // 2}-"


def test_a_server_that_never_answers_ends_in_e012_with_each_attempt_shown(cache, server, monkeypatch, capsys):
    monkeypatch.setenv("PROVISION_STALL_S", "0.2")
    server.plans = ["silent"] * 10
    t0 = time.monotonic()
    assert pull(server.url(PATH), "--sha256", SHA) == errors.DownloadFailed.exit_status
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert err.count("the server sent nothing") >= download.MAX_ATTEMPTS
    assert "tiny: attempt 1: no answer within 0.2s" in err


def test_the_total_attempt_budget_ends_a_pull_that_only_creeps_forward(cache, server, monkeypatch, capsys):
    monkeypatch.setattr(download, "MAX_TOTAL_ATTEMPTS", 4)
    server.plans = [f"truncate_at:{k * 1000}" for k in range(1, 10)]
    assert pull(server.url(PATH), "--sha256", SHA) == errors.DownloadFailed.exit_status
    assert "gave up after 4 attempts (4 attempts in all)" in capsys.readouterr().err
    assert len(server.requests) == 4


def test_stall_timeout_flag_is_used_and_checked(cache, server, capsys):
    server.plans = [f"pause_at:{SIZE // 2}"]
    assert pull(server.url(PATH), "--sha256", SHA, "--stall-timeout", "0.3") == 0
    assert "stalled: no byte for 0.3s after byte" in capsys.readouterr().err
    assert pull(server.url(PATH), "--stall-timeout", "nan") == errors.InvalidValue.exit_status


def test_a_slow_transfer_keeps_printing_progress(cache, server, monkeypatch, capsys):
    from provision.core import progress

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.03)
    server.files["/small.gguf"] = BODY[: 256 * 1024]
    server.plans = ["drip:0.02"]  # 64 pieces of 4 KiB: about 1.3 s
    assert pull(server.url("/small.gguf"), "--name", "small") == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "MiB/s" in line]
    assert len(lines) > 12, lines  # more than the ten 10 % steps and the final line


def test_a_damaged_blob_of_the_right_size_is_re_verified_and_fetched_again(cache, server, capsys):
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    blob = cache / "blobs" / f"sha256-{SHA}"
    blob.chmod(0o644)
    blob.write_bytes(BODY[:-1] + bytes([BODY[-1] ^ 1]))
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    assert "is damaged; fetching it again" in capsys.readouterr().err
    assert blob.read_bytes() == BODY and len(server.body_requests()) == 2


def test_changed_file_validator_makes_the_server_send_everything(cache, server):
    server.plans = [f"reset_at:{SIZE // 2}"]
    server_etag = server.etag

    def swap_etag() -> None:  # after the first request the "file" gets a new ETag
        while not server.requests or server.requests[0].sent == 0:
            time.sleep(0.001)
        server.etag = '"v2-strong"'

    import threading

    t = threading.Thread(target=swap_etag)
    t.start()
    assert pull(server.url(PATH), "--sha256", SHA) == 0
    t.join()
    second = server.requests[1]
    assert second.if_range == server_etag and second.status == 200  # If-Range did not match: full body


def test_redirects_are_followed_on_loopback(cache, server):
    server.plans = [f"redirect:{server.url(PATH)}"]
    assert pull(server.url("/elsewhere.gguf"), "--sha256", SHA, "--name", "tiny") == 0
    assert [r.path for r in server.requests] == ["/elsewhere.gguf", PATH]


def test_no_space_for_content_length_is_e013_before_any_byte(cache, server, capsys):
    server.plans = ["huge_length"]
    assert pull(server.url(PATH)) == errors.DiskFull.exit_status
    assert "E013" in capsys.readouterr().err
    assert stored(cache)["blobs"] == []


# --- names and URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["model", "pull", "../evil"],
        ["model", "pull", "a/b/c"],
        ["model", "path", ".."],
        ["model", "rm", "x/../../etc"],
        ["model", "verify", "..hidden"],
        ["model", "pull", "https://127.0.0.1:1/x.gguf", "--name", "../x"],
        ["model", "pull", "hf://owner/repo/../secret.gguf"],
    ],
)
def test_names_with_dotdot_or_slash_are_rejected_with_e014(cache, argv, capsys):
    assert cli.main(argv) == errors.BadModelName.exit_status
    assert "E014" in capsys.readouterr().err
    assert not (cache.parent / "x.json").exists()


def test_check_name_accepts_catalog_style_names():
    for name in ("tiny-llama", "qwen2.5-0.5b-instruct-q4_k_m", "Llama-3.2-3B.Q4_K_M"):
        assert check_name(name) == name


@pytest.mark.parametrize("url", ["http://192.0.2.1/x.gguf", "ftp://127.0.0.1/x.gguf", "file:///etc/passwd"])
def test_plain_http_beyond_loopback_and_other_schemes_are_refused(cache, url, capsys):
    assert pull(url, "--sha256", SHA) == errors.InvalidValue.exit_status
    assert "E003" in capsys.readouterr().err


def test_hf_reference_is_resolved_through_the_hub_client_endpoint(cache, server, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    server.files["/owner/repo/resolve/0123abc/sub/tiny.gguf"] = BODY
    assert pull("hf://owner/repo/sub/tiny.gguf@0123abc", "--sha256", SHA) == 0
    assert server.requests[0].path == "/owner/repo/resolve/0123abc/sub/tiny.gguf"
    assert json.loads((cache / "refs" / "tiny.json").read_text())["source"] == "hf://owner/repo/sub/tiny.gguf@0123abc"


def test_catalog_models_resolve_to_pinned_urls_offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    pins = default_pins()
    spec = resolve(models.DEFAULT_MODEL, pins)
    pin = pins.models[models.DEFAULT_MODEL]
    owner_repo_file, rev = pin.hf.removeprefix("hf://").split("@")
    owner, repo, file = owner_repo_file.split("/", 2)
    assert spec.url == f"{constants.ENDPOINT}/{owner}/{repo}/resolve/{rev}/{file}"
    assert (spec.sha256, spec.size, spec.pin_status) == (pin.sha256, pin.size, "READ")


def test_sha256_that_contradicts_the_catalog_is_refused(cache, capsys):
    assert pull(models.DEFAULT_MODEL, "--sha256", SHA) == errors.InvalidValue.exit_status
    assert "contradicts" in capsys.readouterr().err


def test_unknown_catalog_name_is_e010(cache, capsys):
    assert pull("no-such-model") == errors.UnknownModel.exit_status
    assert "E010" in capsys.readouterr().err


# --- the body pipeline: straight into its buffers, O_DIRECT, chunked bodies ------------------------


def test_a_streamed_body_is_hashed_and_written_whole_mostly_with_direct_io(server, tmp_path: Path, monkeypatch):
    writers: list[pipeline.FileWriter] = []
    opened = pipeline.FileWriter.open

    def record(fd: int, path: Path) -> pipeline.FileWriter:
        writers.append(opened(fd, path))
        return writers[-1]

    monkeypatch.setattr(pipeline.FileWriter, "open", record)
    path = tmp_path / "tiny.partial"
    hasher = hashlib.sha256()
    with web.get(server.url(PATH)) as resp, open(path, "wb", buffering=0) as f:
        progress = Progress("tiny", SIZE, stream=io.StringIO())
        done = pipeline.stream_body(resp, f, path, hasher, 0, progress, check_magic=True)
    assert done == SIZE and hasher.hexdigest() == SHA and path.read_bytes() == BODY
    [writer] = writers
    assert writer.direct_bytes > SIZE // 2, (writer.direct_bytes, writer.cached_bytes)


def test_a_chunked_body_without_a_length_is_pulled_whole(cache, server):
    server.plans = ["chunked"]
    assert pull(server.url(PATH), "--sha256", SHA, "--name", "tiny") == 0
    assert (cache / "blobs" / f"sha256-{SHA}").read_bytes() == BODY
    assert server.requests[0].status == 200 and server.requests[0].range is None


# --- processes: locks, SIGKILL and resume, file size limit ---------------------------------------


def test_two_concurrent_pulls_download_once(cache, server):
    server.plans = [f"pause_at:{SIZE // 2}"]  # the first pull stalls mid-body, holding the lock
    cmd = [sys.executable, "-m", "provision", "model", "pull", server.url(PATH), "--sha256", SHA]
    run = {"env": env_for(cache), "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    first = subprocess.Popen(cmd, **run)
    assert server.paused.wait(30)
    second = subprocess.Popen(cmd, **run)
    assert second.stderr is not None
    waiting = second.stderr.readline()  # blocks until the second pull reports the held lock
    assert "waiting for another pull" in waiting
    server.release.set()
    outs = [p.communicate(timeout=60) for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs
    assert len(server.body_requests()) == 1 and server.sent_total() == SIZE
    assert json.loads((cache / "refs" / "tiny.json").read_text())["sha256"] == SHA
    assert (cache / "blobs" / f"sha256-{SHA}").read_bytes() == BODY


def test_pull_killed_at_half_resumes_and_refetches_at_most_one_percent(cache, server):
    big = models_http.gguf_bytes(16 * 1024 * 1024, seed=7)
    sha = hashlib.sha256(big).hexdigest()
    server.files["/big.gguf"] = big
    half = len(big) // 2
    server.plans = [f"pause_at:{half}"]
    cmd = [sys.executable, "-m", "provision", "model", "pull", server.url("/big.gguf"), "--sha256", sha]
    proc = subprocess.Popen(cmd, env=env_for(cache), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = cache / "partial" / f"{sha}.partial"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size >= half):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    server.release.set()
    assert not (cache / "blobs" / f"sha256-{sha}").exists()

    done = subprocess.run(cmd, env=env_for(cache), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    resumed = server.requests[1]
    assert resumed.range is not None and resumed.status == 206
    refetched = server.sent_total() - len(big)
    assert refetched <= len(big) // 100, (refetched, resumed.range)
    assert (cache / "blobs" / f"sha256-{sha}").read_bytes() == big


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024 * 1024, 1024 * 1024))


def test_file_size_limit_mid_download_is_e013_and_nothing_is_promoted(cache, server):
    cmd = [sys.executable, "-m", "provision", "model", "pull", server.url(PATH), "--sha256", SHA]
    done = subprocess.run(
        cmd, env=env_for(cache), capture_output=True, text=True, timeout=60, preexec_fn=_limit_file_size
    )
    assert done.returncode == errors.DiskFull.exit_status, done.stderr
    assert "E013" in done.stderr and "File too large" in done.stderr
    assert stored(cache) == {"blobs": [], "refs": [], "partial": []}
