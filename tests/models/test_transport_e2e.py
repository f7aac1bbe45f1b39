"""A model pulled through the Ollama-style registry on loopback runs in a real `llama-linux` guest.

The registry (tests/models/registries.py on the loopback fault server) serves the synthetic
tiny-llama as ollama serves a model: manifest, model layer by digest, template and params. The
pull goes through `provision model pull ollama://…` as a process, then `provision run llama-linux
--model NAME` boots the guest (QEMU under TCG, the image and host tools of tests/hosts/linux) and
llama.cpp generates from the pulled bytes, whose sha256 the guest itself reports.
"""

from __future__ import annotations

import hashlib
import io
import re
import uuid
from pathlib import Path

import pytest

from provision.models import store as models
from tests.helpers import run_provision
from tests.hosts.linux.test_linux_e2e import image, tools  # noqa: F401 - the module fixtures, reused
from tests.models import models_http, registries

pytestmark = pytest.mark.slow
PROMPT = "t1 t2 t3"


def test_a_model_pulled_from_an_ollama_registry_runs_in_a_llama_linux_guest(image: None, tmp_path: Path) -> None:  # noqa: F811
    tiny = models.Store(root=tmp_path / "store", out=io.StringIO()).synth(models.SMOKE_MODEL).path.read_bytes()
    # Another last weight (an f16 of output.weight) makes bytes no store holds yet, so the pull must fetch them.
    run_id = uuid.uuid4().hex[:8]
    tiny = tiny[:-2] + bytes.fromhex(run_id[:2]) + b"\x00"
    sha = hashlib.sha256(tiny).hexdigest()
    server = models_http.start({})
    name = f"e2e-ollama-{run_id}"
    try:
        blob = registries.publish_ollama(server, tiny, repo="library/tiny-e2e", tag="q")
        env = {"PROVISION_OLLAMA_REGISTRY": server.base.removeprefix("http://"), "PROVISION_SHORTNAMES": "/dev/null"}
        pulled = run_provision("model", "pull", "ollama://tiny-e2e:q", "--name", name, "--yes", env=env)
        assert pulled.returncode == 0, pulled.stderr[-2000:]
        assert [r.path for r in server.requests if r.sent == len(tiny)] == [blob]
        script = (
            'sha256sum "$MODEL"; echo "@@text"; '
            f"llama-completion -m \"$MODEL\" -dev none -p '{PROMPT}' -n 12 --temp 0 -s 1 --no-warmup "
            "2>/dev/null < /dev/null"
        )
        proc = run_provision("run", "llama-linux", "--model", name, "--timeout", "900", "--", "sh", "-c", script,
                             timeout=1000)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        head, _, text = proc.stdout.partition("@@text")
        assert sha in head  # the guest read exactly the bytes the registry's digest names
        text = re.sub(r"\x1b\[[0-9;]*m", "", text).replace("\u2581", " ").strip()
        assert text.startswith(PROMPT) and len(text) > len(PROMPT) + 8, text
    finally:
        models_http.stop(server)
        run_provision("model", "rm", name)
