"""`provision model inspect NAME`: what a stored GGUF is, read with the gguf package (no model load).

Architecture, parameters (the sum of the tensors' elements), quantization (general.file_type,
else the most common tensor type), context length, tensor count and size; for a split model
the tensors of every part, and the layers kept beside an ollama model (template, params).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from provision.core.errors import NotGguf, ToolMissing
from provision.models.store import Store


def _value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except (AttributeError, ValueError, IndexError):
        return None


def _reader(path: Path) -> Any:
    try:
        import gguf
    except ImportError:
        raise ToolMissing("model inspect reads GGUF files with the gguf package",
                          fix="pip install 'krun-gpu[synth]' (scripts/setup-debian installs it)") from None  # fmt: skip
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as exc:
        raise NotGguf(f"{path}: not a GGUF file gguf can read ({exc})", fix="provision model verify NAME") from None


def inspect(store: Store, name: str) -> dict[str, Any]:
    import gguf

    path = store.path(name)
    ref = store.ref(name)
    assert ref is not None
    blobs = [store.blob_path(sha) for sha, _ in ref.blobs()]
    first = _reader(blobs[0])
    arch = _value(first, "general.architecture")
    tensors = 0
    params = 0
    types: Counter[str] = Counter()
    for i, blob in enumerate(blobs):
        reader = first if i == 0 else _reader(blob)
        for t in reader.tensors:
            tensors += 1
            params += int(t.n_elements)
            types[t.tensor_type.name] += int(t.n_elements)
    file_type = _value(first, "general.file_type")
    try:
        quant = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        quant = None
    extras: dict[str, Any] = {}
    for role, entry in (ref.extras or {}).items():
        text = store.blob_path(entry["sha256"]).read_bytes().decode("utf-8", "replace")
        if role == "params":
            try:
                extras[role] = json.loads(text)
                continue
            except ValueError:
                pass
        extras[role] = text
    return {
        "name": name,
        "path": str(path),
        "architecture": arch,
        "model_name": _value(first, "general.name"),
        "parameters": params,
        "quantization": quant or (types.most_common(1)[0][0] if types else None),
        "context_length": _value(first, f"{arch}.context_length") if arch else None,
        "tensor_count": tensors,
        "size": sum(size for _, size in ref.blobs()),
        "parts": len(blobs),
        "sha256": ref.sha256,
        "source": ref.source,
        **({"extras": extras} if extras else {}),
    }
