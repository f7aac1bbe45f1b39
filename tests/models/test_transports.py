"""Every transport against a loopback server that speaks its protocol, with the fault server's faults.

An Ollama-style registry (ollama://, default registry through PROVISION_OLLAMA_REGISTRY), an OCI
registry behind the bearer-token flow (oci://127.0.0.1:PORT/…) and a Hugging Face-style file
listing (hf.co/ORG/REPO:QUANT through HF_ENDPOINT). Each pulls, survives a close midway, a wrong
Content-Range and a stall, resumes after a SIGKILL, and refuses bytes that do not match the
digest the registry or the listing names. The model is the synthetic tiny-llama.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from provision import cli
from provision.core import errors
from tests.models import models_http, registries

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Target:
    kind: str
    ref: str
    name: str
    blob: str  # the path the GGUF bytes come from
    body: bytes
    env: dict[str, str]
    source: str = ""  # the reference as the ref records it (canonical), when not as typed

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


def publish(kind: str, server: models_http.ModelServer, body: bytes, served: bytes | None = None) -> Target:
    host = server.base.removeprefix("http://")
    if kind == "ollama":
        blob = registries.publish_ollama(server, body, served=served)
        return Target(kind, "ollama://tiny", "tiny-latest", blob, body, {"PROVISION_OLLAMA_REGISTRY": host},
                      "ollama://library/tiny:latest")  # fmt: skip
    if kind == "oci":
        server.token = "t0ken-for-tests"
        (blob,) = registries.publish_oci(server, [("tiny.gguf", body)], served=served)
        return Target(kind, f"oci://{host}/models/tiny:v1", "tiny-v1", blob, body, {})
    files = {"tiny-Q8_0.gguf": body, "tiny-Q4_K_M.gguf": body[:-1] + b"\0"}
    paths = registries.publish_hf(server, "org/Tiny-GGUF", files, {"tiny-Q8_0.gguf": served} if served else None)
    return Target(kind, "hf.co/org/Tiny-GGUF:Q8_0", "tiny-Q8_0", paths["tiny-Q8_0.gguf"], body,
                  {"HF_ENDPOINT": server.base})  # fmt: skip


KINDS = ("ollama", "oci", "hf")


def pull(target: Target, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    for key, value in target.env.items():
        monkeypatch.setenv(key, value)
    return cli.main(["model", "pull", target.ref, *args])


@pytest.mark.parametrize("kind", KINDS)
def test_each_transport_pulls_by_the_digest_it_names(kind, cache, server, tiny, monkeypatch, capsys):
    target = publish(kind, server, tiny)
    assert pull(target, monkeypatch, "--json") == 0
    report = json.loads(capsys.readouterr().out)["data"]
    want = (target.name, target.sha, target.source or target.ref)
    assert (report["name"], report["sha256"], report["source"]) == want
    assert (cache / "blobs" / f"sha256-{target.sha}").read_bytes() == tiny
    assert [r.path for r in server.requests if r.sent == len(tiny)] == [target.blob]
    assert not any((cache / "partial").iterdir())
    if kind == "oci":  # the token flow ran: a 401, the token service, then the bearer token on every /v2/ request
        assert [r.status for r in server.requests[:3]] == [401, 200, 200]
        assert server.requests[1].path.startswith("/token?") and "scope=repository%3Amodels%2Ftiny%3Apull" in (
            server.requests[1].path
        )
        assert all(r.authorization == "Bearer t0ken-for-tests" for r in server.requests[2:])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "faults,marker",
    [
        (["truncate_at:{half}"], "connection closed after byte"),
        (["truncate_at:{half}", "wrong_range", "wrong_range"], "wrong Content-Range"),
        (["pause_at:{half}"], "stalled: no byte for 1s"),
        (["reset_at:{half}"], "connection lost after byte"),
    ],
    ids=["close-midway", "wrong-content-range", "stall", "reset"],
)
def test_each_transport_survives_the_fault_servers_faults(kind, faults, marker, cache, server, tiny, monkeypatch,
                                                          capsys):  # fmt: skip
    target = publish(kind, server, tiny)
    monkeypatch.setenv("PROVISION_STALL_S", "1")  # short, yet no false stall on a loaded machine
    server.path_plans[target.blob] = [f.format(half=len(tiny) // 2) for f in faults]
    assert pull(target, monkeypatch) == 0
    assert marker in capsys.readouterr().err
    blob_requests = [r for r in server.requests if r.path == target.blob]
    assert blob_requests[-1].status == 206 and blob_requests[-1].range is not None  # the last one resumed
    assert (cache / "blobs" / f"sha256-{target.sha}").read_bytes() == tiny


@pytest.mark.parametrize("kind", KINDS)
def test_each_transport_refuses_bytes_that_are_not_the_digest(kind, cache, server, tiny, monkeypatch, capsys):
    target = publish(kind, server, tiny, served=tiny[:-1] + bytes([tiny[-1] ^ 1]))
    assert pull(target, monkeypatch) == errors.ModelHashMismatch.exit_status
    err = capsys.readouterr().err
    assert "E011" in err and target.sha in err
    assert "--sha256" not in err and "pins" not in err  # the registry's digest or the hub's listing is the pin
    assert not any((cache / "blobs").glob(f"sha256-{target.sha}")) and not any((cache / "refs").iterdir())
    assert not any((cache / "partial").glob("*.partial"))


@pytest.mark.parametrize("kind", KINDS)
def test_each_transport_resumes_after_the_pull_is_killed(kind, cache, server, tiny, monkeypatch):
    target = publish(kind, server, tiny)
    half = len(tiny) // 2
    server.path_plans[target.blob] = [f"pause_at:{half}"]
    env = {**os.environ, **target.env, "PROVISION_CACHE": str(cache.parent), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "provision", "model", "pull", target.ref]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = cache / "partial" / f"{target.sha}.partial"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size >= half):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    server.release.set()
    assert not (cache / "refs" / f"{target.name}.json").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    resumed = [r for r in server.requests if r.path == target.blob][-1]
    assert resumed.status == 206 and resumed.range == f"bytes={half}-"
    assert (cache / "blobs" / f"sha256-{target.sha}").read_bytes() == tiny


# --- what each protocol adds ----------------------------------------------------------------------


def test_ollama_keeps_template_and_params_beside_the_model_and_inspect_shows_them(cache, server, tiny, monkeypatch,
                                                                                  capsys):  # fmt: skip
    target = publish("ollama", server, tiny)
    assert pull(target, monkeypatch) == 0
    ref = json.loads((cache / "refs" / "tiny-latest.json").read_text())
    assert set(ref["extras"]) == {"template", "params"}
    capsys.readouterr()
    assert cli.main(["model", "inspect", "tiny-latest", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["data"]
    assert info["extras"] == {"template": registries.TEMPLATE, "params": registries.PARAMS}
    assert info["architecture"] == "llama" and info["context_length"] == 256
    assert cli.main(["model", "verify", "tiny-latest"]) == 0


def test_ollama_wrong_tag_is_e010_and_fetches_nothing(cache, server, tiny, monkeypatch, capsys):
    target = publish("ollama", server, tiny)
    target.ref = "ollama://tiny:no-such-tag"
    assert pull(target, monkeypatch) == errors.UnknownModel.exit_status
    err = capsys.readouterr().err
    assert "E010" in err and "no such repository or tag" in err and "fix:" in err
    assert [r.path for r in server.requests] == ["/v2/library/tiny/manifests/no-such-tag"]


def test_bare_name_and_tag_is_an_ollama_reference(cache, server, tiny, monkeypatch):
    target = publish("ollama", server, tiny)
    target.ref = "tiny:latest"
    assert pull(target, monkeypatch) == 0
    assert json.loads((cache / "refs" / "tiny-latest.json").read_text())["source"] == "ollama://library/tiny:latest"


def test_oci_credentials_come_from_the_authfile(cache, server, tiny, monkeypatch, tmp_path, capsys):
    target = publish("oci", server, tiny)
    server.users = {"me": "s3cret"}
    assert pull(target, monkeypatch) == errors.DownloadFailed.exit_status
    assert "--authfile" in capsys.readouterr().err
    host = server.base.removeprefix("http://")
    authfile = tmp_path / "auth.json"
    import base64

    authfile.write_text(json.dumps({"auths": {host: {"auth": base64.b64encode(b"me:s3cret").decode()}}}))
    assert pull(target, monkeypatch, "--authfile", str(authfile)) == 0
    token_requests = [r for r in server.requests if r.path.startswith("/token")]
    assert token_requests[-1].authorization == "Basic " + base64.b64encode(b"me:s3cret").decode()


def test_oci_bearer_token_is_not_sent_to_the_host_a_blob_redirects_to(cache, server, tiny, monkeypatch):
    target = publish("oci", server, tiny)
    cdn = models_http.start({"/cdn/tiny.gguf": tiny})
    try:
        server.path_plans[target.blob] = [f"redirect:http://localhost:{cdn.httpd.server_address[1]}/cdn/tiny.gguf"]
        assert pull(target, monkeypatch) == 0
        assert [r.authorization for r in cdn.requests] == [None]
        assert [r.authorization for r in server.requests if r.path == target.blob] == ["Bearer t0ken-for-tests"]
    finally:
        models_http.stop(cdn)


def test_hf_shorthand_picks_the_quant_from_the_listing_and_names_what_exists(cache, server, tiny, monkeypatch,
                                                                             capsys):  # fmt: skip
    target = publish("hf", server, tiny)
    target.ref = "hf.co/org/Tiny-GGUF:Q5_K_S"
    assert pull(target, monkeypatch) == errors.UnknownModel.exit_status
    err = capsys.readouterr().err
    assert "no GGUF file for quantization Q5_K_S" in err and "Q4_K_M, Q8_0" in err
    target.ref = "org/Tiny-GGUF"  # bare ORG/REPO, no quant: Q4_K_M, as ollama and the hub choose
    assert pull(target, monkeypatch, "--json") == 0
    report = json.loads(capsys.readouterr().out)["data"]
    assert report["name"] == "tiny-Q4_K_M" and report["sha256"] == hashlib.sha256(tiny[:-1] + b"\0").hexdigest()


def test_sha256_is_not_taken_beside_a_digest_pinned_reference(cache, server, tiny, monkeypatch, capsys):
    target = publish("ollama", server, tiny)
    assert pull(target, monkeypatch, "--sha256", "ab" * 32) == errors.InvalidValue.exit_status
    assert "is the pin" in capsys.readouterr().err and server.requests == []


# --- where a reference without a registry goes ------------------------------------------------------


def test_ollama_and_bare_name_tag_go_to_the_public_registries_by_default(cache, monkeypatch, capsys):
    # No setting and no user file: the shipped [registries] decide. The registry answers 404 here,
    # so what is asserted is the URL that would be used; nothing leaves this machine.
    from provision.adapters import registry as reg

    asked: list[str] = []

    def answer(self: reg.Registry, url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        asked.append(url)
        return 404, {}, b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}'

    monkeypatch.setattr(reg.Registry, "_get", answer)
    for typed in ("ollama://kquant", "kquant:latest", "gemma3:1b", "docker://ai/smollm2"):
        assert cli.main(["model", "pull", typed]) == errors.UnknownModel.exit_status
    assert asked == [
        "https://registry.ollama.ai/v2/library/kquant/manifests/latest",
        "https://registry.ollama.ai/v2/library/kquant/manifests/latest",
        "https://registry.ollama.ai/v2/library/gemma3/manifests/1b",  # the shipped shortname's reference
        "https://registry-1.docker.io/v2/ai/smollm2/manifests/latest",
    ]
    err = capsys.readouterr().err
    assert "E010" in err and "None" not in err and "not set" not in err


def test_a_missing_or_bad_default_registry_is_said_in_words(cache, monkeypatch):
    from provision.models import shortnames

    with pytest.raises(errors.InvalidValue) as missing:
        shortnames.registry("oci")  # oci:// always names its registry: there is no default
    assert "none is set" in missing.value.message and "None" not in missing.value.message
    user = Path(os.environ["PROVISION_SHORTNAMES"])
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text('[registries]\n"ollama" = "not a host!"\n')
    with pytest.raises(errors.InvalidValue) as bad:
        shortnames.registry("ollama")
    assert f"{user} registries.ollama = 'not a host!'" in bad.value.message
