"""What a file given to ``quantweave.load`` is, before torch reads it, and atomic writes for
``quantweave.save``.

:func:`check_loadable` names the file and says what it is when it is not a program
``quantweave.load`` can read: missing (``FileNotFoundError``), a directory, empty, not a
zip archive, a truncated archive (it starts like one but its directory is gone), a
``torch.save`` file (a state dict or a pickled object, old or new format) rather than a
``torch.export`` program, or a program written by a newer quantweave (``quantweave.json``
records the version that saved it). :func:`atomic_target` writes to a temporary file beside
the target and moves it into place only when the write succeeded, so a failed save never
leaves a half-written file where the caller's file was.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import SerializationError

__all__ = ["META", "atomic_target", "check_loadable", "version_tuple"]

#: the extra file of a ``.pt2`` archive recording the quantweave that wrote it
META = "quantweave.json"

_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP_MAGIC = b"PK\x05\x06"
_PICKLE_PROTOCOLS = tuple(bytes([0x80, p]) for p in range(2, 6))


def version_tuple(version: str) -> tuple[int, ...]:
    """(0, 1, 1) for '0.1.1', '0.1.1.dev3+g...' or '0.1.1rc1': the leading numbers."""
    numbers = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()


def check_loadable(path: Path, ours: str) -> None:
    """Raise unless ``path`` looks like a program ``quantweave.load`` can read (see the
    module docstring); ``ours``: this quantweave's version."""
    where = f"quantweave.load: {str(path)!r}"
    if not path.exists():
        raise FileNotFoundError(
            f"{where} does not exist (no such file); give the path of a .pt2 file saved by "
            "quantweave.save or torch.export.save"
        )
    if path.is_dir():
        raise SerializationError(f"{where} is a directory, not a file; give the path of the .pt2 file in it")
    with path.open("rb") as f:
        head = f.read(4)
    if not head:
        raise SerializationError(
            f"{where} is empty (0 bytes): the save that wrote it did not finish; save the model again"
        )
    if head[:2] in _PICKLE_PROTOCOLS or head[:1] == b"\x80":
        raise SerializationError(
            f"{where} is a torch.save file (a pickle in torch's legacy format: a state dict or a pickled object), "
            "not a program saved by quantweave.save / torch.export.save; read it with torch.load (a state dict "
            "goes into a model with model.load_state_dict)"
        )
    if head not in (_ZIP_MAGIC, _EMPTY_ZIP_MAGIC):
        raise SerializationError(
            f"{where} is not a .pt2 archive (a zip file): it starts with bytes {head!r}; give a file saved by "
            "quantweave.save or torch.export.save"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            meta = [n for n in names if n.endswith(f"/extra/{META}") or n == f"extra/{META}"]
            recorded = archive.read(meta[0]) if meta else None
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise SerializationError(
            f"{where} is a truncated or corrupt archive: it starts as a zip file but cannot be read ({exc}); "
            "it was probably cut short while being written or copied: save or copy it again"
        ) from exc
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names) and not any("/models/" in n for n in names):
        raise SerializationError(
            f"{where} is a torch.save file (a state dict or a pickled object), not a program saved by "
            "quantweave.save / torch.export.save; read it with torch.load (a state dict goes into a model with "
            "model.load_state_dict), or save the converted model with quantweave.save"
        )
    if not any(n.endswith("/models/model.json") or "/models/" in n for n in names):
        raise SerializationError(
            f"{where} is a zip archive but not a torch.export program (it has no models/ entry); give a file "
            "saved by quantweave.save or torch.export.save"
        )
    if recorded is None:
        return  # any torch.export.save file
    try:
        info = json.loads(recorded)
        saved_by = str(info["quantweave"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SerializationError(f"{where}: its {META} is not readable ({exc}); the file is corrupt") from exc
    if version_tuple(saved_by) > version_tuple(ours):
        raise SerializationError(
            f"{where} was written by quantweave {saved_by}, newer than this quantweave {ours}: upgrade "
            "quantweave (pip install -U quantweave) to load it"
        )


def _mode(target: Path) -> int:
    """The mode of the file being replaced, or that of a new file under the umask."""
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_target(target: Path) -> Iterator[Path]:
    """A temporary path beside ``target`` to write to; moved onto ``target`` when the block
    completes, removed when it raises (``target`` is then as it was)."""
    if target.is_dir():
        raise SerializationError(f"quantweave.save: {str(target)!r} is a directory; give a file path (model.pt2)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".part.pt2", dir=target.parent)
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        os.chmod(temporary, _mode(target))  # mkstemp makes it private: give it the mode a new file gets
        os.replace(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
