"""``quantweave compare``: quantize a model from a file or module and show the numeric
debugger in the annotation report, worst first (issue 14)."""

import json
import textwrap

import pytest
import torch
from torch import nn

import quantweave as qw
from quantweave.cli import main
from quantweave.plugin_api import hookimpl
from quantweave.registry import PluginManager, QuantizerInfo
from quantweave.testing.reference import make_reference_quantizer


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


def build():
    """The MODEL factory the tests name as tests.core.test_cli_compare:build."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    return Net(), [(torch.randn(2, 3, 8, 8, generator=gen),) for _ in range(3)]


def build_exported_one_batch():
    model, batches = build()
    return torch.export.export(model.eval(), batches[0]).module(), batches[0]


def not_a_pair():
    return Net()


def failing():
    raise RuntimeError("no data here")


class Plugin:
    QUANTWEAVE_PLUGIN_API = 1

    @hookimpl
    def quantweave_quantizers(self):
        return [QuantizerInfo("reference", make_reference_quantizer)]


@pytest.fixture
def pm():
    manager = PluginManager(entry_points=[])
    manager.register("ref", Plugin())
    return manager


def run(capsys, pm, *argv):
    code = main(["compare", *argv], manager=pm)
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_prints_the_report_with_numerics_worst_first(capsys, pm):
    code, out, err = run(capsys, pm, "tests.core.test_cli_compare:build", "--quantizer", "reference")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        "tests.core.test_cli_compare:build quantized by reference, calibrated on 3 batch(es); worst first:"
    )
    assert lines[1].split()[:5] == ["node", "op", "status", "quantizer", "op"]

    # the same numbers as the API gives
    model, batches = build()
    exported = torch.export.export(model.eval(), batches[0]).module()
    quantizer = pm.get_quantizer("reference")
    prepared = qw.prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
    numerics = qw.compare(exported, qw.convert_pt2e(prepared), batches)
    expected = qw.annotation_report(prepared, quantizer, numerics=numerics).to_table(worst_first=True)
    assert lines[1:] == expected.splitlines()
    compared = [line.split()[0] for line in lines[3:] if line.split()[4] != "-"][:2]
    worst = [op.node for op in numerics.ops if op.node in {"conv2d", "linear"}]
    assert compared == worst


def test_compare_json_and_options(capsys, pm, tmp_path):
    code, out, err = run(
        capsys,
        pm,
        "tests.core.test_cli_compare:build",
        "--quantizer",
        "reference",
        "--option",
        "histogram=True",
        "--calibration-batches",
        "2",
        "--compare-batches",
        "1",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["options"] == {"histogram": "True"} and data["calibration_batches"] == 2
    assert data["compare"]["batches"] == 1 and data["compare"]["ops"]
    rows = {row["node"]: row for row in data["annotation_report"]["nodes"]}
    assert "sqnr_db" in rows["conv2d"]["numerics"] and rows["conv2d"]["status"] == "quantized"
    assert data["annotation_report"]["summary"]["numerics"]["batches"] == 1


def test_compare_loads_a_file_and_an_exported_model_with_one_batch(capsys, pm, tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(
        textwrap.dedent(
            """
            from tests.core.test_cli_compare import build_exported_one_batch as make
            """
        )
    )
    code, out, err = run(capsys, pm, f"{path}:make", "--quantizer", "reference", "--top", "1")
    assert code == 0, err
    assert "calibrated on 1 batch(es)" in out.splitlines()[0]
    assert "more row(s)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nocolon", "--quantizer", "reference"], "MODEL 'nocolon': expected FILE.py:FUNCTION or MODULE:FUNCTION"),
        (["/nowhere/m.py:f", "--quantizer", "reference"], "MODEL '/nowhere/m.py:f': no file /nowhere/m.py"),
        (["no_such_module_xyz:f", "--quantizer", "reference"], "cannot import no_such_module_xyz"),
        (["tests.core.test_cli_compare:nope", "--quantizer", "reference"], "defines no 'nope'"),
        (["tests.core.test_cli_compare:Plugin.x", "--quantizer", "reference"], "defines no 'Plugin.x'"),
        (
            ["tests.core.test_cli_compare:not_a_pair", "--quantizer", "reference"],
            "returned Net; expected (model, batches)",
        ),
        (
            ["tests.core.test_cli_compare:failing", "--quantizer", "reference"],
            "calling it failed: RuntimeError: no data here",
        ),
        (["tests.core.test_cli_compare:build", "--quantizer", "nope"], "--quantizer nope: "),
        (
            ["tests.core.test_cli_compare:build", "--quantizer", "reference", "--option", "x"],
            "--option 'x': expected KEY=VALUE",
        ),
        (
            ["tests.core.test_cli_compare:build", "--quantizer", "reference", "--option", "bogus=1"],
            "--quantizer reference: quantizer ref:reference rejected options ['bogus']",
        ),
        (
            ["tests.core.test_cli_compare:build", "--quantizer", "reference", "--top", "0"],
            "--top must be at least 1; got 0",
        ),
    ],
)
def test_bad_arguments_are_named(capsys, pm, argv, message):
    code, out, err = run(capsys, pm, *argv)
    assert code == 2 and out == ""
    assert err.startswith("quantweave compare: ") and message in err, err


def test_a_failing_step_is_named(capsys, pm):
    class Refusing(qw.Quantizer):
        def annotate(self, model):
            raise qw.AnnotationError("cannot annotate this")

    class RefusingPlugin:
        QUANTWEAVE_PLUGIN_API = 1

        @hookimpl
        def quantweave_quantizers(self):
            return [QuantizerInfo("refusing", Refusing)]

    pm.register("refusing", RefusingPlugin())
    code, _out, err = run(capsys, pm, "tests.core.test_cli_compare:build", "--quantizer", "refusing")
    assert code == 1
    assert "prepare_pt2e of MODEL tests.core.test_cli_compare:build with --quantizer refusing failed" in err
    assert "AnnotationError: cannot annotate this" in err
