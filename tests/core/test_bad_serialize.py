"""Bad files for quantweave.load / a failing quantweave.save (issue #20).

Each case asserts the exception type, that the message names the file and says what it is
(and what to do), and that the caller's files are byte-for-byte what they were (a load only
reads; a failed save leaves the target as it was and no temporary file behind).
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import pickle
import stat
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import quantweave as qw
import quantweave.serialize as serialize
from quantweave.errors import SerializationError
from quantweave.testing.reference import make_reference_quantizer
from tests.helpers import assert_names


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


EXAMPLE = (torch.randn(2, 4, generator=torch.Generator().manual_seed(0)),)


@pytest.fixture(scope="module")
def models() -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    torch.manual_seed(0)
    exported = torch.export.export(Small().eval(), EXAMPLE).module()
    prepared = qw.prepare_pt2e(exported, make_reference_quantizer())
    qw.calibrate(prepared, [EXAMPLE], progress=False)
    return prepared, qw.convert_pt2e(prepared)


@pytest.fixture(scope="module")
def good_file(tmp_path_factory: pytest.TempPathFactory, models: tuple) -> Path:
    return qw.save(models[1], EXAMPLE, tmp_path_factory.mktemp("good") / "model.pt2")


def digest(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def load_refused(path: Path, *named: str) -> str:
    before = digest(path) if path.is_file() else None
    with pytest.raises(SerializationError) as info:
        qw.load(path)
    message = str(info.value)
    assert str(path) in message, message
    for word in named:
        assert word in message, (word, message)
    if before is not None:
        assert digest(path) == before  # only read
    return message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "model.pt2"
    with pytest.raises(FileNotFoundError) as info:
        qw.load(path)
    assert_names(info, "quantweave.load", str(path), "does not exist", ".pt2 file")  # the fix: a .pt2 file's path
    assert not path.parent.exists()


def test_a_directory_is_named(tmp_path: Path) -> None:
    load_refused(tmp_path, "is a directory")


def test_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.pt2"
    path.write_bytes(b"")
    load_refused(path, "is empty")


def test_a_file_that_is_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "noise.pt2"
    path.write_bytes(b"this is not a model at all\n" * 10)
    load_refused(path, "not a .pt2 archive", "zip")


@pytest.mark.parametrize("legacy", [False, True])
def test_a_torch_save_state_dict_is_told_apart(tmp_path: Path, models: tuple, legacy: bool) -> None:
    path = tmp_path / "weights.pt"
    torch.save(models[1].state_dict(), path, _use_new_zipfile_serialization=not legacy)
    load_refused(path, "torch.save file", "state dict", "torch.load", "load_state_dict")


def test_a_truncated_archive(tmp_path: Path, good_file: Path) -> None:
    path = tmp_path / "cut.pt2"
    data = good_file.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    load_refused(path, "truncated or corrupt archive", "again")


def test_a_zip_that_is_not_a_program(tmp_path: Path) -> None:
    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    load_refused(path, "not a torch.export program")


def _rewrite(source: Path, target: Path, replace: dict[str, bytes]) -> None:
    """A copy of the archive ``source`` with entries (by name suffix) replaced."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
        for item in old.infolist():
            data = old.read(item.filename)
            for suffix, content in replace.items():
                if item.filename.endswith(suffix):
                    data = content
            new.writestr(item, data)


def test_a_file_written_by_a_newer_quantweave(tmp_path: Path, good_file: Path) -> None:
    path = tmp_path / "future.pt2"
    meta = json.dumps({"quantweave": "99.0.0", "format": "torch.export"}).encode()
    _rewrite(good_file, path, {"extra/quantweave.json": meta})
    message = load_refused(path, "quantweave 99.0.0", "newer", qw.__version__, "upgrade")
    assert "pip install -U quantweave" in message


def test_a_program_torch_cannot_read(tmp_path: Path, good_file: Path) -> None:
    path = tmp_path / "garbled.pt2"
    _rewrite(good_file, path, {"models/model.json": b"{not json"})
    load_refused(path, "torch.export.load cannot read", "corrupt")


def test_a_good_file_still_loads_and_is_not_touched(good_file: Path, models: tuple) -> None:
    before = digest(good_file)
    loaded = qw.load(good_file)
    assert torch.equal(loaded(*EXAMPLE), models[1](*EXAMPLE))
    assert digest(good_file) == before


# -- save: a failure never leaves a half-written file ------------------------------------------------


def test_a_failing_write_leaves_the_previous_file(
    tmp_path: Path, models: tuple, good_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "model.pt2"
    target.write_bytes(good_file.read_bytes())
    before = digest(target)

    def half_write(program, path, **kwargs):
        Path(path).write_bytes(b"PK\x03\x04 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(serialize.torch.export, "save", half_write)
    with pytest.raises(OSError, match="No space left") as info:
        qw.save(models[1], EXAMPLE, target)
    assert str(target) in " ".join(info.value.__notes__)
    assert digest(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt2"]  # no temporary file left


def test_a_failing_write_to_a_new_path_leaves_nothing(
    tmp_path: Path, models: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(program, path, **kwargs):
        raise RuntimeError("serializer bug")

    monkeypatch.setattr(serialize.torch.export, "save", broken)
    with pytest.raises(RuntimeError, match="serializer bug"):
        qw.save(models[1], EXAMPLE, tmp_path / "new.pt2")
    assert list(tmp_path.iterdir()) == []


def test_saving_a_prepared_model_leaves_the_target_alone(tmp_path: Path, models: tuple, good_file: Path) -> None:
    target = tmp_path / "model.pt2"
    target.write_bytes(good_file.read_bytes())
    before = digest(target)
    with pytest.raises(SerializationError) as info:
        qw.save(models[0], EXAMPLE, target)
    assert_names(info, "quantweave.save", "observers", "'activation_post_process_", "quantweave.convert_pt2e")
    assert digest(target) == before


def test_saving_to_a_directory_is_named(tmp_path: Path, models: tuple) -> None:
    with pytest.raises(SerializationError) as info:
        qw.save(models[1], EXAMPLE, tmp_path)
    assert_names(info, "quantweave.save", str(tmp_path), "directory", "file path")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_re_export_names_the_target(tmp_path: Path, models: tuple) -> None:
    with pytest.raises(Exception) as info:
        qw.save(models[1], (torch.randn(2, 5),), tmp_path / "model.pt2")
    assert "model.pt2" in " ".join(getattr(info.value, "__notes__", [])) and "nothing was written" in " ".join(
        info.value.__notes__
    )
    assert list(tmp_path.iterdir()) == []


def test_a_saved_file_gets_the_usual_mode(tmp_path: Path, models: tuple) -> None:
    umask = os.umask(0)
    os.umask(umask)
    path = qw.save(models[1], EXAMPLE, tmp_path / "model.pt2")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # a new file's mode, not the temporary's 0600
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt2"]


@pytest.mark.parametrize("which", ["prepared", "converted"])
@pytest.mark.parametrize("how", ["pickle", "torch.save", "a deep copy, pickled"])
def test_pickling_a_prepared_or_converted_model_says_what_to_use(models: tuple, which: str, how: str) -> None:
    """torch.export's modules cannot be pickled, nor can ours: a TypeError at once that names
    quantweave.save / load (a converted model failed with RecursionError, a prepared one on a
    weakref, naming neither); the model keeps working, and deep copies still work."""
    model = models[0] if which == "prepared" else models[1]
    expected = model(*EXAMPLE)
    with pytest.raises(TypeError) as info:
        if how == "pickle":
            pickle.dumps(model)
        elif how == "torch.save":
            torch.save(model, io.BytesIO())
        else:
            pickle.dumps(copy.deepcopy(model))
    assert_names(info, "cannot pickle", "quantweave.convert_pt2e", "quantweave.save(model, example_inputs, path)")
    assert_names(info, "quantweave.load(path)", "torch.save")
    assert torch.equal(model(*EXAMPLE), expected)
    assert torch.equal(copy.deepcopy(model)(*EXAMPLE), expected)
