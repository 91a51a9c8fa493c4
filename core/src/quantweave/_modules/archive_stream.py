"""``torch.export.save`` writing each weight straight from its storage (``quantweave.save``).

torch 2.13's ``.pt2`` packager turns every weight into a ``bytes`` copy of its storage
(``_get_raw_tensor_bytes``) and hands that to the zip writer's ``write_record``, whose
binding copies it once more: saving briefly holds two extra copies of the largest weight
(for an LLM, the token table or the head: 0.7x of it again in float32 on a 0.35 GB model).
The zip writer also takes a storage and writes from its memory; inside
:func:`streamed_weights`, the packager's raw bytes of a CPU tensor are a zero-length
``bytes`` carrying the tensor, and the archive writer gives the writer the tensor's storage
for those, so nothing is copied. The archive is byte-for-byte the one torch writes
(``tests/core/test_save_streaming.py``).

Where torch's internals are not the ones this knows (another torch version), it does
nothing and ``torch.export.save`` runs as it is. The patch is process-wide while the block
runs; a lock keeps two saves from interleaving their patches.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from .torch_compat import pt2_packager

__all__ = ["streamed_weights"]

_LOCK = threading.RLock()


class _TensorPayload(bytes):
    """Zero-length ``bytes`` standing for a tensor's storage, written by the archive writer."""

    tensor: torch.Tensor


@contextlib.contextmanager
def streamed_weights() -> Iterator[bool]:
    """Within the block, ``torch.export.save`` writes CPU weights from their storages;
    yields whether it does (False: torch's internals are not the known ones)."""
    package = pt2_packager()
    if package is None:  # pragma: no cover - another torch
        yield False
        return
    with _LOCK:
        raw_bytes = package._get_raw_tensor_bytes
        writer = package.PT2ArchiveWriter
        write_bytes = writer.write_bytes

        def raw_tensor_bytes(value: torch.Tensor) -> bytes:
            if (
                (type(value) is torch.Tensor or isinstance(value, torch.nn.Parameter))
                and value.device.type == "cpu"
                and value.data_ptr()
            ):
                payload = _TensorPayload()
                payload.tensor = value
                return payload
            return raw_bytes(value)

        def write_tensor_bytes(self: Any, name: str, data: bytes) -> None:
            if isinstance(data, _TensorPayload):
                storage = data.tensor.untyped_storage()
                self.archive_file.write_record(name, storage, storage.nbytes())
                return
            write_bytes(self, name, data)

        package._get_raw_tensor_bytes = raw_tensor_bytes
        writer.write_bytes = write_tensor_bytes
        try:
            yield True
        finally:
            package._get_raw_tensor_bytes = raw_bytes
            writer.write_bytes = write_bytes
