"""Bad quantizer options (issue #20): a module-name or module-type option of a first-party
plugin (x86, xnnpack, embedding) that matches no module of the model selects nothing; it is
warned about (MisuseWarning) naming the quantizer, the option and the name, with close
matches. The warning is raised at prepare (the options are set before the model is known),
and the caller's model is bit-identical afterwards."""

from __future__ import annotations

import warnings

import pytest
import torch

import quantweave as qw
from quantweave.plugin_api import warn_unknown_modules
from quantweave_embedding import EmbeddingQuantizer
from quantweave_x86 import X86InductorQuantizer, get_default_x86_inductor_quantization_config
from quantweave_xnnpack import XNNPACKQuantizer, get_symmetric_quantization_config
from tests.helpers import assert_names, exported_once_fixtures


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(16, 8)
        self.layers = torch.nn.Sequential(Block(), Block())
        self.head = torch.nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.tok(ids)))


IDS = torch.randint(0, 16, (2, 5))


# the caller's model, exported once for the module's tests, unchanged before and after each; seed 0:
# the weights each test's own export had (the autouse seed, then Net())
_caller_once, caller = exported_once_fixtures("caller", lambda: Net().eval(), lambda: (IDS,), seed=0)


XNN = get_symmetric_quantization_config()
X86 = get_default_x86_inductor_quantization_config()

#: (case, quantizer, what the MisuseWarning names: the quantizer, the option and its name, the close matches or
#: the model's modules)
CASES = [
    (
        "x86 module name typo",
        lambda: X86InductorQuantizer().set_module_name_qconfig("layer.0", None),
        ("quantizer 'x86'", "set_module_name_qconfig('layer.0')", "no module", "did you mean 'layers.0'"),
    ),
    (
        "x86 module name of another model",
        lambda: X86InductorQuantizer().set_module_name_qconfig("encoder.attention", X86),
        (
            "quantizer 'x86'",
            "set_module_name_qconfig('encoder.attention')",
            "no module",
            "modules of the model: 'head', 'layers'",
        ),
    ),
    (
        "xnnpack module name typo",
        lambda: XNNPACKQuantizer().set_global(XNN).set_module_name("layers.0.porj", None),
        ("quantizer 'xnnpack'", "set_module_name('layers.0.porj')", "no module", "did you mean 'layers.0.proj'"),
    ),
    (
        "xnnpack module type not in the model",
        lambda: XNNPACKQuantizer().set_global(XNN).set_module_type(torch.nn.Conv2d, None),
        (
            "quantizer 'xnnpack'",
            "set_module_type(Conv2d)",
            "torch.nn.modules.conv.Conv2d",
            "no module",
            "module types of the model",
        ),
    ),
    (
        "embedding module name typo",
        lambda: EmbeddingQuantizer().set_module_name("tok_emb", None),
        ("quantizer 'embedding'", "set_module_name('tok_emb')", "no module", "did you mean 'tok'"),
    ),
    (
        "embedding module type not in the model",
        lambda: EmbeddingQuantizer().set_module_type(torch.nn.EmbeddingBag, None),
        ("quantizer 'embedding'", "set_module_type(EmbeddingBag)", "no module", "did you mean 'Embedding'"),
    ),
]


@pytest.mark.parametrize(("case", "build", "names"), CASES, ids=[c[0] for c in CASES])
def test_a_module_option_matching_no_module_warns_naming_option_name_and_close_matches(caller, case, build, names):
    with pytest.warns(qw.MisuseWarning) as caught:
        qw.prepare_pt2e(caller, build())
    assert_names(caught, *names)


def test_the_warning_names_each_unknown_module_once_per_prepare(caller):
    quantizer = XNNPACKQuantizer().set_global(XNN).set_module_name("a.b", None).set_module_name("layers.1", None)
    with pytest.warns(qw.MisuseWarning) as record:
        qw.prepare_pt2e(caller, quantizer)
    named = [str(w.message) for w in record if issubclass(w.category, qw.MisuseWarning)]
    assert len(named) == 1 and "'a.b'" in named[0]


def test_options_naming_modules_of_the_model_do_not_warn(caller):
    quantizers = [
        X86InductorQuantizer().set_module_name_qconfig("layers.0", None),
        XNNPACKQuantizer().set_global(XNN).set_module_name("head", None).set_module_type(Block, XNN),
        EmbeddingQuantizer().set_module_name("tok", None).set_module_type(torch.nn.Embedding, None),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", qw.MisuseWarning)
        prepared = [qw.prepare_pt2e(caller, q) for q in quantizers]
    assert len(prepared) == 3


def test_warn_unknown_modules_returns_the_unknown_and_says_nothing_without_module_stacks(caller):
    with pytest.warns(qw.MisuseWarning) as caught:
        unknown = warn_unknown_modules(caller, "set_block", ["layers.9", "layers.1", Block], quantizer="mine")
    assert_names(caught, "quantizer 'mine'", "set_block('layers.9')")
    assert unknown == ["layers.9"]
    bare = torch.export.export(Net().eval(), (IDS,)).module()
    for node in bare.graph.nodes:
        node.meta.pop("nn_module_stack", None)  # a graph that records no module stacks: nothing to check against
    with warnings.catch_warnings():
        warnings.simplefilter("error", qw.MisuseWarning)
        assert warn_unknown_modules(bare, "set_block", ["nowhere"]) == []
