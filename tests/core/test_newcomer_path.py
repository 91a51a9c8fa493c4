"""The newcomer's path (issue #26): the smaller points, each as a user meets it."""

import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave.cli import main
from quantweave.plugin_api import hookimpl
from quantweave.registry import PluginManager, QuantizerInfo
from quantweave.testing.reference import make_reference_quantizer
from tests.helpers import assert_names, export


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def prepared_model(batch: int = 2):
    exported = export(Net(), torch.randn(batch, 4))
    return exported, qw.prepare_pt2e(exported, make_reference_quantizer())


def test_a_composition_prints_its_members_in_priority_order():
    first, second = make_reference_quantizer(), make_reference_quantizer()
    text = repr(qw.ComposableQuantizer([first, second]))
    assert text.startswith("ComposableQuantizer([") and text.endswith("])")
    assert text.count(type(first).__name__) == 2


def test_calibrate_with_no_batches_warns_and_does_not_blame_weight_observers():
    _, prepared = prepared_model()
    weights = {
        str(n.target)
        for n in prepared.graph.nodes
        if n.op == "call_module" and n.args and getattr(n.args[0], "op", None) == "get_attr"
    }
    assert weights  # the linear's weight is observed
    with pytest.warns(qw.MisuseWarning) as caught:
        result = qw.calibrate(prepared, [])
    assert result.batches == 0 and result.not_observed
    assert not weights & set(result.not_observed), result.not_observed
    # what was called, what it got, the observers that need data, what follows, the fix
    assert_names(caught, "quantweave.calibrate", "no batches", *result.not_observed[:3], "ObserverNotCalibratedError")
    assert_names(caught, "DataLoader", "at least one batch")


def test_calibrate_with_batches_does_not_warn():
    _, prepared = prepared_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", qw.MisuseWarning)
        result = qw.calibrate(prepared, [(torch.randn(2, 4),)])
    assert result.batches == 1 and result.not_observed == ()


def test_preparing_a_converted_model_says_it_is_converted():
    _, prepared = prepared_model()
    prepared(torch.randn(2, 4))
    converted = qw.convert_pt2e(prepared)
    with pytest.raises(ValueError) as info:
        qw.prepare_pt2e(converted, make_reference_quantizer())
    assert_names(info, "prepare_pt2e", "already converted", "float exported model")  # the fix: prepare that
    assert "quantize_per_tensor" in str(info.value) or "dequantize" in str(info.value)  # names a q/dq node
    assert "another graph" not in str(info.value)


@pytest.mark.parametrize("stage", ["prepared", "converted"])
def test_a_batch_of_another_size_says_how_to_export_a_dynamic_batch(stage):
    exported, prepared = prepared_model(batch=2)
    prepared(torch.randn(2, 4))
    model = prepared if stage == "prepared" else qw.convert_pt2e(prepared)
    with pytest.raises(AssertionError) as info:  # the class torch's guard raises
        model(torch.randn(3, 4))
    message = str(info.value)
    assert "'x'" in message and "(3, 4)" in message and "(2, 4)" in message  # the input, got and exported
    assert "dynamic_shapes={'x': {0: torch.export.Dim.AUTO}}" in message
    assert type(exported._guards_fn).__name__ == "GuardsFn"  # the caller's module is untouched
    model(torch.randn(2, 4))  # the exported size still runs


def test_the_dynamic_batch_export_the_message_gives_runs_other_sizes():
    model = Net().eval()
    exported = torch.export.export(model, (torch.randn(2, 4),), dynamic_shapes={"x": {0: torch.export.Dim.AUTO}})
    prepared = qw.prepare_pt2e(exported.module(), make_reference_quantizer())
    qw.calibrate(prepared, [(torch.randn(2, 4),), (torch.randn(5, 4),)])
    assert qw.convert_pt2e(prepared)(torch.randn(3, 4)).shape == (3, 4)


def test_the_fallback_module_is_float_fallback_and_the_old_name_warns():
    import quantweave.float_fallback as module

    assert callable(qw.fallback) and qw.fallback is module.fallback  # the function, not a module
    with pytest.warns(DeprecationWarning, match="quantweave.float_fallback"):
        from quantweave.fallback import fused_units
    assert fused_units is module.fused_units
    import quantweave.fallback  # noqa: F401  (the old name imports, and does not rebind the function)

    assert qw.fallback is module.fallback


class Plugin:
    QUANTWEAVE_PLUGIN_API = 1

    @hookimpl
    def quantweave_quantizers(self):
        return [QuantizerInfo("reference", make_reference_quantizer)]


def test_compare_imports_modules_next_to_the_file_like_python_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)  # neither the current directory nor the path has the folder
    (tmp_path / "newcomer_helper_model.py").write_text(
        textwrap.dedent(
            """
            import torch

            def make():
                net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
                return net, [(torch.randn(2, 4),)]
            """
        )
    )
    (tmp_path / "build.py").write_text("from newcomer_helper_model import make\n")
    manager = PluginManager(entry_points=[])
    manager.register("ref", Plugin())
    before = list(sys.path)
    try:
        code = main(["compare", f"{tmp_path / 'build.py'}:make", "--quantizer", "reference"], manager=manager)
    finally:
        sys.modules.pop("newcomer_helper_model", None)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "build.py:make quantized by reference" in out
    assert sys.path == before  # restored after the run
