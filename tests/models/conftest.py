"""Fixtures the model-store tests share: a tiny real GGUF, a store cache with no model setting
leaking in from the environment, and an HTTP server on loopback for the transports."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from provision.models import download
from provision.models import store as models
from tests.models import models_http

# Every variable that changes where a reference is pulled from or when a pull asks or gives up.
MODEL_SETTINGS = ("PROVISION_OLLAMA_REGISTRY", "PROVISION_DOCKER_REGISTRY", "HF_ENDPOINT", "PROVISION_STALL_S",
                  "PROVISION_ASK_ABOVE")  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    root = tmp_path_factory.mktemp("tiny-store")
    return models.Store(root=root, out=io.StringIO()).synth(models.SMOKE_MODEL).path.read_bytes()


@pytest.fixture
def cache(empty_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(download, "BACKOFF_S", 0.01)
    for key in MODEL_SETTINGS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PROVISION_SHORTNAMES", str(tmp_path / "user-shortnames.conf"))
    return empty_cache / "models"


@pytest.fixture
def server():
    srv = models_http.start({})
    yield srv
    models_http.stop(srv)
