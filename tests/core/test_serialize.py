"""quantweave.save / quantweave.load: a converted model through a file in one call."""

import pytest
import torch

import quantweave as qw
from quantweave.testing.models import calibration_batches, example_inputs, resnet18_like
from quantweave.testing.reference import make_reference_quantizer
from tests.helpers import assert_names, export


@pytest.fixture(scope="module")
def flow():
    model = resnet18_like(blocks=(1, 1, 1), width=32, num_classes=10)
    args = example_inputs(model)
    prepared = qw.prepare_pt2e(export(model, *args), make_reference_quantizer())
    qw.calibrate(prepared, calibration_batches(model, 2), progress=False)
    return model, args, prepared, qw.convert_pt2e(prepared)


def test_round_trip_through_a_file_is_bit_identical_and_keeps_int8_weights(flow, tmp_path):
    model, args, _, converted = flow
    path = qw.save(converted, args, tmp_path / "sub" / "model.pt2")
    assert path == tmp_path / "sub" / "model.pt2" and path.is_file()
    loaded = qw.load(path)
    assert isinstance(loaded, torch.fx.GraphModule)
    x = torch.randn_like(args[0])
    assert torch.equal(loaded(x), converted(x))  # bit-identical, on inputs other than the example
    assert torch.equal(loaded(*args), converted(*args))

    int8 = [t for t in loaded.state_dict().values() if t.dtype == torch.int8]
    assert int8 and sum(t.numel() for t in int8) > 0.9 * sum(p.numel() for p in model.parameters())
    fp32_path = tmp_path / "fp32.pt2"
    torch.export.save(torch.export.export(model, args), fp32_path)
    assert path.stat().st_size < 0.5 * fp32_path.stat().st_size  # weights stored as int8 (float would be >= 1x)

    program = torch.export.load(path)  # an ordinary torch.export file
    assert isinstance(program, torch.export.ExportedProgram)
    extra = {"quantweave.json": ""}
    torch.export.load(path, extra_files=extra)
    assert f'"quantweave": "{qw.__version__}"' in extra["quantweave.json"]


def test_a_single_tensor_and_an_exported_program_are_accepted(flow, tmp_path):
    _, args, _, converted = flow
    first = qw.save(converted, args[0], tmp_path / "a.pt2")
    second = qw.save(torch.export.export(converted, args), args, tmp_path / "b.pt2")
    assert torch.equal(qw.load(first)(*args), qw.load(second)(*args))


def test_a_prepared_model_is_a_clear_error_naming_its_first_observer(flow, tmp_path):
    _, args, prepared, _ = flow
    with pytest.raises(qw.SerializationError) as info:
        qw.save(prepared, args, tmp_path / "p.pt2")
    assert_names(info, "observers", "activation_post_process_", "Observer")
    with pytest.raises(ValueError) as info:  # a built-in to catch broadly
        qw.save(prepared, args, tmp_path / "p.pt2")
    assert_names(info, "prepared, not converted")
    assert not (tmp_path / "p.pt2").exists()


def test_not_a_graph_module_is_a_clear_error(tmp_path):
    with pytest.raises(qw.SerializationError) as info:
        qw.save(torch.nn.Linear(2, 2), (torch.randn(1, 2),), tmp_path / "x.pt2")
    assert_names(info, "GraphModule", "quantweave.convert_pt2e")
