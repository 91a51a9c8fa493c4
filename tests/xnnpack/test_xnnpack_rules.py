"""quantweave-xnnpack's rule table: the declaration, the annotation steps and the float reasons
come from the same rows."""

import torch
from torch import nn

import quantweave_xnnpack as qx
from quantweave.plugin_api import SKIP_REASON_KEY, Mode, is_annotated
from quantweave_xnnpack._capabilities import declared_capabilities
from quantweave_xnnpack._rules import MATCHERS, TABLE, steps_for
from tests.helpers import export


def _config(**options):
    return qx.get_symmetric_quantization_config(**options)


def test_declared_patterns_are_the_rows_of_each_mode_in_row_order():
    for mode, options in ((Mode.STATIC, {}), (Mode.DYNAMIC, {"is_dynamic": True}), (Mode.QAT, {"is_qat": True})):
        assert tuple(c.pattern for c in declared_capabilities(**options)) == TABLE.patterns(mode)


def test_a_config_applies_the_matchers_of_the_rows_declared_in_its_mode():
    def named(mode):
        return {r.annotate.name for r in TABLE if r.annotate is not None and r.applies(mode)}

    assert (
        {m.name for m in steps_for(_config(is_dynamic=True))}
        == named(Mode.DYNAMIC)
        == {
            "linear",
            "weight_matmul",
            "conv",
            "conv_transpose",
        }
    )
    assert {m.name for m in steps_for(_config())} == named(Mode.STATIC)
    assert not any(m.name.endswith(("_bn", "_bn_relu")) for m in steps_for(_config()))
    assert [m.name for m in steps_for(_config(is_qat=True))] == [m.name for m in MATCHERS]  # in matcher order
    # a dynamic QAT config also applies the QAT-only conv + batch norm matchers
    assert {m.name for m in steps_for(_config(is_dynamic=True, is_qat=True))} >= {"conv_bn", "conv_bn_relu"}
    assert steps_for(None) == list(MATCHERS)


def test_sharing_rows_say_why_an_op_stayed_float():
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x).flatten(1)

    gm = export(M(), torch.randn(2, 3, 4))
    q = qx.XNNPACKQuantizer().set_global(_config())
    q.annotate(gm)
    relu = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.relu.default)
    assert not is_annotated(relu)
    assert TABLE["relu"].why_float is not None
    assert relu.meta[SKIP_REASON_KEY] == TABLE["relu"].why_float(relu)
    assert "'x'" in relu.meta[SKIP_REASON_KEY] and "relu" in relu.meta[SKIP_REASON_KEY]


def test_every_match_is_anchored_on_a_node_calling_its_matchers_anchor_ops():
    """The quantizer skips a matcher when no node calls one of its anchor ops: that holds only
    while each match's anchor calls one of them, on graphs with every op the matchers look for."""
    from quantweave.authoring import calls

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
            self.conv2, self.convt = nn.Conv2d(4, 4, 1), nn.ConvTranspose2d(4, 4, 1)
            self.bnt, self.linear = nn.BatchNorm2d(4), nn.Linear(4, 4)
            self.register_buffer("w", torch.randn(4, 4))

        def forward(self, x):
            y = torch.relu(self.bn(self.conv(x)))
            y = torch.relu(self.conv2(y)) + self.bnt(self.convt(y))
            y = torch.relu(y * y) + torch.relu(y + 1.0)
            z = torch.cat([y, y * 2], 1)
            v = nn.functional.adaptive_avg_pool2d(z, 1).flatten(1)[:, :4]
            return torch.relu(self.linear(v)) + self.linear(v) + v @ self.w + torch.addmm(v, v, self.w)

    gm = qx.XNNPACKQuantizer().transform_for_annotation(export(M().train(), torch.randn(2, 3, 8, 8)))
    found = 0
    for matcher in MATCHERS:
        for match in matcher(gm):
            assert calls(match.anchor, matcher.anchors), (matcher.name, match.anchor.name)
            found += 1
    assert found >= len(MATCHERS)
