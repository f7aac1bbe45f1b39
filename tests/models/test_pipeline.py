"""The body pipeline's writer on a real file: unaligned spans land in place, the aligned middle with O_DIRECT.

The spans are laid out as stream_body lays them out (page-aligned buffers, each span at the
buffer offset that mirrors its file offset modulo ALIGN); the file is read back and compared.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
from pathlib import Path

from provision.models import pipeline
from tests.models import models_http

ALIGN = pipeline.ALIGN


def _spans(total: int, seed: int) -> list[int]:
    """Lengths that add up to ``total``: single bytes, one short of a block, one over, whole MiBs and odd ones."""
    rng = random.Random(seed)
    sizes, left = [], total
    while left:
        choices = [1, 3, ALIGN - 1, ALIGN + 1, 2 * ALIGN, (1 << 20) + 17, 3 << 20, rng.randrange(1, 1 << 22)]
        n = min(left, rng.choice(choices))
        sizes.append(n)
        left -= n
    return sizes


def _write_all(writer: pipeline.FileWriter, data: bytes, start: int, sizes: list[int]) -> None:
    buf = memoryview(mmap.mmap(-1, pipeline.BUFFER_SIZE + ALIGN))
    offset, pos = start, 0
    for n in sizes:
        first = offset % ALIGN
        buf[first : first + n] = data[pos : pos + n]
        writer.write(buf[first : first + n], offset)
        offset, pos = offset + n, pos + n


def test_unaligned_spans_land_in_place_and_the_aligned_middle_goes_direct(tmp_path: Path):
    data = models_http.gguf_bytes(24 << 20, seed=3)
    path = tmp_path / "body.partial"
    with open(path, "wb", buffering=0) as f:
        writer = pipeline.FileWriter.open(f.fileno(), path)
        assert writer.direct_fd is not None, "O_DIRECT refused on the test's file system: the fast path is untested"
        _write_all(writer, data, 0, _spans(len(data), seed=1))
        writer.close()
        os.fsync(f.fileno())
    assert path.read_bytes() == data
    assert writer.direct_bytes + writer.cached_bytes == len(data)
    assert writer.direct_bytes > len(data) * 0.9, (writer.direct_bytes, writer.cached_bytes)


def test_a_resume_at_an_unaligned_offset_keeps_the_prefix_and_writes_the_rest_in_place(tmp_path: Path):
    data = models_http.gguf_bytes(9 << 20, seed=4)
    start = 200_001  # wherever the last attempt stopped
    path = tmp_path / "body.partial"
    path.write_bytes(data[:start])
    with open(path, "r+b", buffering=0) as f:
        writer = pipeline.FileWriter.open(f.fileno(), path)
        _write_all(writer, data[start:], start, _spans(len(data) - start, seed=2))
        writer.close()
    assert path.read_bytes() == data
    assert writer.direct_bytes > 0


def test_a_file_system_that_refuses_direct_writes_gets_every_byte_through_the_page_cache(tmp_path: Path, monkeypatch):
    data = models_http.gguf_bytes(5 << 20, seed=5)
    path = tmp_path / "body.partial"
    real_pwrite = os.pwrite
    refused: list[int] = []
    with open(path, "wb", buffering=0) as f:
        writer = pipeline.FileWriter.open(f.fileno(), path)
        direct = writer.direct_fd

        def pwrite(fd: int, view, offset: int) -> int:
            if fd == direct:
                refused.append(offset)
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_pwrite(fd, view, offset)

        monkeypatch.setattr(os, "pwrite", pwrite)
        _write_all(writer, data, 0, [ALIGN * 3, 1 << 20, len(data) - ALIGN * 3 - (1 << 20)])
        monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert refused == [0]  # tried once, then never again
    assert writer.direct_fd is None and writer.direct_bytes == 0 and writer.cached_bytes == len(data)
    assert path.read_bytes() == data
