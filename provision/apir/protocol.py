"""What the guest sends and what the host serves, command by command (issue 15, item 4).

The APIR protocol has two layers:
- virglrenderer's (src/apir/apir-protocol.h on the host, api_remoting.h in llama.cpp on the
  guest): HandShake, LoadLibrary, Forward, their return codes and the handshake magic. The
  MR 1590 host says 0.1 and the pinned guest 0.2, but the two headers declare the same
  three commands with the same ids and the same codes: the minor number is all that differs.
- the forwarded commands (shared/apir_backend.gen.h on the guest, backend-dispatched.gen.h
  in the host library): served by libggml-virtgpu-backend, which we build from the same
  llama.cpp tree as the guest, so the guest's list and the host's table come from one tree.

`compare` reads both from the source trees and lists every command the guest could send
that the host lacks or numbers differently; the pins hold the host's virglrenderer layer
(the tree is not always at hand), and `checks/linux-apir` checks those pins against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from provision.core import pins as pins_mod

GUEST_HEADER = "ggml/src/ggml-virtgpu/backend/shared/api_remoting.h"
GUEST_FORWARDED = "ggml/src/ggml-virtgpu/backend/shared/apir_backend.gen.h"
HOST_TABLE = "ggml/src/ggml-virtgpu/backend/backend-dispatched.gen.h"
VIRGL_HEADER = "src/apir/apir-protocol.h"

_ENTRY = re.compile(r"\b(APIR_[A-Za-z_0-9]+)\s*=\s*(0x[0-9a-fA-F]+|\d+)")
_TABLE = re.compile(r"/\*\s*(APIR_COMMAND_TYPE_[A-Z_0-9]+)\s*=\s*\*/\s*(\w+)")


def _enum(text: str, name: str) -> dict[str, int]:
    m = re.search(rf"enum\s+{name}\s*\{{(.*?)\}}", text, re.S) or re.search(
        rf"typedef\s+enum\s*\{{(.*?)\}}\s*{name}\s*;", text, re.S
    )
    if m is None:
        raise ValueError(f"enum {name} not found")
    return {k: int(v, 0) for k, v in _ENTRY.findall(m.group(1))}


def _norm(name: str) -> str:
    """APIR_COMMAND_TYPE_HandShake and APIR_COMMAND_TYPE_HANDSHAKE are the same command."""
    return name.upper()


def virgl_layer(header_text: str) -> dict[str, int]:
    """The commands and codes of virglrenderer's layer, names upper-cased."""
    out: dict[str, int] = {}
    for enum in ("ApirCommandType", "ApirLoadLibraryReturnCode", "ApirForwardReturnCode"):
        out.update({_norm(k): v for k, v in _enum(header_text, enum).items()})
    magic = re.search(r"#define\s+APIR_HANDSHAKE_MAGIC\s+(0x[0-9a-fA-F]+|\d+)", header_text)
    if magic:
        out["APIR_HANDSHAKE_MAGIC"] = int(magic.group(1), 0)
    return out


def guest_virgl_layer(llama_tree: Path) -> dict[str, int]:
    return virgl_layer((llama_tree / GUEST_HEADER).read_text())


def host_virgl_layer(virgl_tree: Path) -> dict[str, int]:
    return virgl_layer((virgl_tree / VIRGL_HEADER).read_text())


def pinned_host_virgl_layer(pin_set: pins_mod.Pins | None = None) -> dict[str, int]:
    pin = (pin_set or pins_mod.default()).source("virglrenderer-apir")
    return {k: int(v) for k, v in pin["apir_protocol"]["virgl_layer"].items()}


# The guest's names for what the host header calls CFG_KEY_MISSING / NO_DISPATCH_FN.
ALIASES = {
    "APIR_LOAD_LIBRARY_ENV_VAR_MISSING": "APIR_LOAD_LIBRARY_CFG_KEY_MISSING",
    "APIR_FORWARD_NO_DISPATCH_FCT": "APIR_FORWARD_NO_DISPATCH_FN",
}


@dataclass
class Comparison:
    virgl_missing_on_host: list[str] = field(default_factory=list)
    virgl_mismatched: list[str] = field(default_factory=list)
    forwarded_missing_on_host: list[str] = field(default_factory=list)
    forwarded_count: int = 0

    @property
    def ok(self) -> bool:
        return not (self.virgl_missing_on_host or self.virgl_mismatched or self.forwarded_missing_on_host)


def forwarded(llama_tree: Path) -> tuple[dict[str, int], list[str]]:
    """The guest's forwarded command ids, and the host library's dispatch table in order."""
    guest = _enum((llama_tree / GUEST_FORWARDED).read_text(), "ApirBackendCommandType")
    guest.pop("APIR_BACKEND_DISPATCH_TABLE_COUNT", None)
    table = [name for name, _fn in _TABLE.findall((llama_tree / HOST_TABLE).read_text())]
    return guest, table


def compare(guest_layer: dict[str, int], host_layer: dict[str, int], llama_tree: Path) -> Comparison:
    out = Comparison()
    for name, value in sorted(guest_layer.items()):
        if name == "APIR_COMMAND_TYPE_LENGTH":
            continue
        host_name = ALIASES.get(name, name)
        if host_name not in host_layer:
            out.virgl_missing_on_host.append(name)
        elif host_layer[host_name] != value:
            out.virgl_mismatched.append(f"{name}: guest {value}, host {host_layer[host_name]}")
    guest_fw, table = forwarded(llama_tree)
    out.forwarded_count = len(guest_fw)
    for name, idx in sorted(guest_fw.items(), key=lambda kv: kv[1]):
        if idx >= len(table) or table[idx] != name:
            out.forwarded_missing_on_host.append(f"{name} ({idx})")
    return out
