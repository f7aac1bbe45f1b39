"""What this Mac has for the route choice (routes.choose), from files only: the krun bundle and its
APIR libraries, the route the podman machine was started with, the newest APIR-vs-Venus bench."""

from __future__ import annotations

import os
from pathlib import Path

from provision.bench import history_file
from provision.core.errors import KrunBundleMissing
from provision.routes.choose import HostFacts


def facts() -> HostFacts:
    from provision.adapters.podman_machine import DEFAULT_MACHINE
    from provision.hosts.darwin import bundle as bundle_mod
    from provision.hosts.darwin import machine_state

    speedup = history_file.apir_speedup_measured()
    try:
        b = bundle_mod.locate(None, env=dict(os.environ), home=Path.home())
    except KrunBundleMissing:
        return HostFacts(platform="darwin", apir_speedup=speedup)
    return HostFacts(
        platform="darwin",
        krun_bundle=str(b.krunkit),
        apir_bundle=b.ggml_backend.is_file() and b.ggml_metal.is_file(),
        machine_route=machine_state.recorded_route(DEFAULT_MACHINE),
        apir_speedup=speedup,
    )
