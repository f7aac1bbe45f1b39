"""The execution API's HTTP layer, without guests: a real `provision api` on 127.0.0.1 (and one on a
non-loopback address inside a network namespace), real requests, every refusal with its status and code.
The guests themselves are in tests/api/test_api_e2e.py (slow)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.api import auth, status
from provision.api.settings import Listen, Settings, parse_listen
from provision.core import errors
from tests.api.client import Api, api_server

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    with api_server() as server:
        yield server


def provision(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True, text=True, timeout=60)


def token_file(tmp_path: Path, mode: int = 0o600, token: str = "t0ken-" + "a" * 26) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


# --- schema and read-only endpoints ----------------------------------------------------------


def test_openapi_lists_the_endpoints_and_schemas(api: Api) -> None:
    code, _, schema = api.request("GET", "/openapi.json")
    assert code == 200
    assert set(schema["paths"]) == {"/api/v1/execute", "/api/v1/execute/stream", "/api/v1/stacks", "/api/v1/health"}
    assert {"ExecuteRequest", "ExecuteResult", "ErrorBody", "StackInfo", "Health"} <= set(
        schema["components"]["schemas"]
    )
    execute = schema["paths"]["/api/v1/execute"]["post"]
    assert {"200", "400", "401", "408", "413", "503"} <= set(execute["responses"]) and "422" not in execute["responses"]
    assert "application/x-ndjson" in schema["paths"]["/api/v1/execute/stream"]["post"]["responses"]["200"]["content"]
    request = schema["components"]["schemas"]["ExecuteRequest"]
    assert {"language", "gpu", "timeout", "code", "model"} <= set(request["properties"])


def test_health_and_stacks(api: Api) -> None:
    code, _, health = api.request("GET", "/api/v1/health")
    assert code == 200 and health["status"] == "ok" and health["running"] == 0 and health["gpu_slots"] >= 1
    code, _, stacks = api.request("GET", "/api/v1/stacks")
    by_name = {s["name"]: s for s in stacks}
    assert by_name["llama-linux"]["gpu"] and by_name["llama-linux"]["runs_here"]
    assert not by_name["cpu"]["gpu"] and not by_name["llama"]["runs_here"]


# --- refusals, each before any VM ------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"language": "cpu", ', "not valid JSON"),
        (b'{"language": "cpu", "code": "true", "gpu": "yes"}', "gpu"),
        (b'{"language": "cpu", "code": "true", "timeout": 0}', "timeout"),
        (b'{"language": "cpu", "code": "true", "timeout": 99999}', "timeout"),
        (b'{"language": "cpu", "code": "true", "network": true}', "network"),
        (b'{"language": "cpu"}', "code"),
        (b'{"language": "Bad Name!", "code": "true"}', "language"),
        (b'["cpu"]', "body"),
    ],
)
def test_malformed_bodies_are_400_e003(api: Api, raw: bytes, words: str) -> None:
    code, _, body = api.request("POST", "/api/v1/execute", raw=raw)
    assert code == 400 and body["error"]["code"] == "E003", body
    assert words in body["error"]["message"]
    assert "Traceback" not in json.dumps(body)


def test_stack_alias_unknown_stack_and_foreign_stack(api: Api) -> None:
    code, _, body = api.execute({"stack": "no-such-stack", "code": "true"})
    assert code == 400 and body["error"]["code"] == "E001" and "no-such-stack" in body["error"]["message"]
    code, _, body = api.execute({"language": "llama", "code": "true"})
    assert code == 400 and body["error"]["code"] == "E033"


def test_gpu_on_a_stack_without_gpu_is_400_e007_at_once(api: Api) -> None:
    start = time.monotonic()
    code, _, body = api.execute({"language": "cpu", "gpu": True, "timeout": 60, "code": "true"})
    assert code == 400 and body["error"]["code"] == "E007" and body["error"]["fix"]
    assert time.monotonic() - start < 2.0  # a VM boot takes minutes; room for a loaded runner
    assert api.children() == []


def test_oversize_bodies_and_code_are_413(api: Api) -> None:
    big = json.dumps({"language": "cpu", "code": "x" * (2 * 1024 * 1024)}).encode()
    code, _, body = api.request("POST", "/api/v1/execute", raw=big)
    assert code == 413 and body["error"]["code"] == "E003"
    # the same without Content-Length: chunks are counted as they come
    conn = socket.create_connection((api.host, api.port))
    head = b"POST /api/v1/execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Transfer-Encoding: chunked\r\n\r\n"
    conn.sendall(head)
    for i in range(0, len(big), 65536):
        piece = big[i : i + 65536]
        try:
            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        except OSError:  # the server answered and closed: what we want
            break
    conn.settimeout(10)
    reply = b""
    while b'"E003"' not in reply and (chunk := conn.recv(65536)):
        reply += chunk
    conn.close()
    assert reply.startswith(b"HTTP/1.1 413") and b'"E003"' in reply
    # a body under the limit whose code is over the code limit
    code, _, body = api.execute({"language": "cpu", "code": "x" * (300 * 1024)})
    assert code == 413 and "code of" in body["error"]["message"]


def test_code_with_a_nul_byte_is_400(api: Api) -> None:
    code, _, body = api.execute({"language": "cpu", "code": "echo a\u0000b"})
    assert code == 400 and "NUL" in body["error"]["message"]


def test_models_must_be_valid_names_already_in_the_store(api: Api, tmp_path: Path) -> None:
    code, _, body = api.execute({"language": "cpu", "code": "true", "model": "../etc/passwd"})
    assert code == 400 and body["error"]["code"] == "E014"
    code, _, body = api.execute({"language": "cpu", "code": "true", "model": "not-stored-anywhere"})
    assert code == 400 and body["error"]["code"] == "E010"


def test_unknown_paths_and_methods_answer_json(api: Api) -> None:
    code, _, body = api.request("GET", "/api/v1/nothing")
    assert code == 404 and body["error"]["code"] == "E003"
    code, _, body = api.request("GET", "/api/v1/execute")
    assert code == 405 and body["status"] == 405


# --- listening and tokens --------------------------------------------------------------------


def test_a_non_loopback_listener_needs_a_token_file_only_its_owner_can_read(tmp_path: Path) -> None:
    proc = provision("api", "--listen", "10.77.0.1:0")
    assert proc.returncode == 13 and "E003" in proc.stderr and "--token-file" in proc.stderr
    proc = provision("api", "--listen", "10.77.0.1:0", "--token-file", str(token_file(tmp_path, 0o644)))
    assert proc.returncode == 13 and "mode 0644" in proc.stderr and "chmod 600" in proc.stderr
    proc = provision("api", "--listen", "example.org:80")
    assert proc.returncode == 13 and "not an IP address" in proc.stderr
    short = token_file(tmp_path, token="short")
    proc = provision("api", "--listen", "127.0.0.1:0", "--token-file", str(short))
    assert proc.returncode == 13 and "at least" in proc.stderr


def test_token_checks_on_a_non_loopback_listener_in_a_network_namespace(tmp_path: Path) -> None:
    """10.77.0.1 on a veth pair inside a fresh network namespace: not loopback, reachable from nowhere else."""
    path = token_file(tmp_path)
    proc = subprocess.run(
        ["unshare", "-rn", sys.executable, "-m", "tests.api.netns", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout)
    assert seen["host"] == "10.77.0.1"
    for name in ("none", "wrong", "basic"):
        assert seen[name]["status"] == 401 and seen[name]["body"]["error"]["code"] == "E050", seen[name]
        assert seen[name]["www-authenticate"] == "Bearer"
    assert seen["right"]["status"] == 200 and seen["right"]["body"]["status"] == "ok"
    assert seen["execute-wrong"]["status"] == 401
    assert seen["execute-right"]["status"] == 400 and seen["execute-right"]["body"]["error"]["code"] == "E007"


def test_policy_and_bearer_check() -> None:
    assert parse_listen("127.0.0.1:8080") == Listen("127.0.0.1", 8080) and parse_listen("localhost:1").loopback
    assert parse_listen("[::1]:9").loopback and not parse_listen("10.0.0.1:9").loopback
    with pytest.raises(errors.InvalidValue):
        auth.require_token_policy(parse_listen("0.0.0.0:8080"), None)
    auth.require_token_policy(parse_listen("0.0.0.0:8080"), "t" * 20)
    auth.check_bearer(None, None)
    auth.check_bearer("Bearer " + "t" * 20, "t" * 20)
    for header in (None, "", "Bearer", "Bearer " + "t" * 19, "Token " + "t" * 20):
        with pytest.raises(errors.Unauthorized):
            auth.check_bearer(header, "t" * 20)


# --- the error table --------------------------------------------------------------------------


def api_table() -> str:
    rows = [f"| {c.code} | {status.HTTP_STATUS[c.code]} | {c.__name__} | {c.summary} |" for c in errors.all_errors()]
    return "\n".join(["| code | HTTP | name | meaning |", "|---|---|---|---|", *rows])


def test_every_error_code_has_an_http_status_and_docs_show_the_table() -> None:
    assert {c.code for c in errors.all_errors()} == set(status.HTTP_STATUS)
    text = (REPO / "docs/api.md").read_text()
    m = re.search(r"<!-- api-status-table[^>]*-->\n(.*?)\n<!-- /api-status-table -->", text, re.S)
    assert m and m.group(1) == api_table(), "run: python -m tests.api.test_api > fix docs/api.md"
    assert "docs/api.md" in (REPO / "README.md").read_text()


# --- a bug answers 500 with a short report ------------------------------------------------------


def test_an_internal_error_is_500_with_a_reference_and_no_traceback() -> None:
    """A real uvicorn on 127.0.0.1 whose backend has a bug (a plain exception, not a ProvisionError)."""
    import uvicorn

    from provision.api.app import create_app
    from provision.api.jobs import Runner

    class Buggy:
        name = "linux"

        def run(self, *_: object, **__: object) -> None:
            raise RuntimeError("secret detail of a bug")

        def gpu_slots(self) -> int:
            return 1

    lines: list[str] = []
    runner = Runner(1, 1024, log=lines.append, host=Buggy())  # type: ignore[arg-type]
    settings = Settings(Listen("127.0.0.1", 0))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(settings, runner), http="h11", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        api = Api(None, "127.0.0.1", sock.getsockname()[1])  # type: ignore[arg-type]
        code, _, body = api.execute({"language": "cpu", "code": "true", "timeout": 10})
    finally:
        server.should_exit = True
        thread.join(30)
    assert code == 500 and body["error"]["code"] == "E000"
    assert "secret" not in json.dumps(body) and "Traceback" not in json.dumps(body)
    ref = re.search(r"as (job \w+)", body["error"]["message"])
    assert ref and any(ref.group(1) in line and "secret detail" in line for line in lines)


if __name__ == "__main__":
    print(api_table())
