"""``quantweave.save`` streams the weights (issue 25), proved by instrumenting the zip writer:
each weight record is written from the tensor's own storage, never from a ``bytes`` copy,
and the archive is byte-for-byte the one ``torch.export.save`` writes."""

from typing import ClassVar

import torch
from torch import nn

import quantweave as qw
from quantweave._modules.archive_stream import streamed_weights


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(300, 64)
        self.fc = nn.Linear(64, 200)

    def forward(self, tokens):
        return self.fc(self.emb(tokens))


class SpyWriter:
    """Wraps torch's zip writer, recording (record name, type of the data given, size)."""

    records: ClassVar[list] = []

    def __init__(self, *args):
        self._writer = REAL_WRITER(*args)

    def write_record(self, name, data, size):
        SpyWriter.records.append((name, type(data), int(size)))
        return self._writer.write_record(name, data, size)

    def __getattr__(self, name):
        return getattr(self._writer, name)


REAL_WRITER = torch._C.PyTorchFileWriter


def _program():
    torch.manual_seed(0)
    model = Net().eval()
    tokens = torch.randint(0, 300, (1, 8))
    return model, tokens, torch.export.export(model, (tokens,))


def test_save_writes_each_weight_from_its_storage_one_record_at_a_time(tmp_path, monkeypatch):
    model, tokens, program = _program()
    SpyWriter.records = []
    monkeypatch.setattr(torch._C, "PyTorchFileWriter", SpyWriter)
    path = qw.save(program, (tokens,), tmp_path / "m.pt2")
    monkeypatch.undo()
    weights = [p.untyped_storage().nbytes() for p in model.parameters()]
    copied = [(name, size) for name, kind, size in SpyWriter.records if kind is bytes]
    weight_records = [r for r in SpyWriter.records if r[0].startswith("data/weights/") and "." not in r[0]]
    assert sorted(size for _, _, size in weight_records) == sorted(weights)  # one record per weight
    assert all(kind is torch.UntypedStorage for _, kind, _ in weight_records), weight_records  # from its storage
    copied = [(name, size) for name, kind, size in SpyWriter.records if kind is bytes]
    assert max(size for _, size in copied) < max(weights) / 10, copied  # the program, configs: no weight
    loaded = qw.load(path)
    assert torch.equal(loaded(tokens), model(tokens))


def test_streamed_archive_is_the_one_torch_writes(tmp_path):
    _, _, program = _program()
    (tmp_path / "torch").mkdir()
    (tmp_path / "streamed").mkdir()
    torch.export.save(program, tmp_path / "torch" / "m.pt2")
    with streamed_weights() as streaming:
        torch.export.save(program, tmp_path / "streamed" / "m.pt2")
    assert streaming
    assert (tmp_path / "streamed" / "m.pt2").read_bytes() == (tmp_path / "torch" / "m.pt2").read_bytes()


def test_torch_internals_are_restored_after_the_block_even_when_saving_fails(tmp_path):
    from torch.export.pt2_archive import _package

    before = (_package._get_raw_tensor_bytes, _package.PT2ArchiveWriter.write_bytes)
    try:
        with streamed_weights():
            raise OSError("disk full")
    except OSError:
        pass
    assert (_package._get_raw_tensor_bytes, _package.PT2ArchiveWriter.write_bytes) == before
