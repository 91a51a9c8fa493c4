"""The session memo of torchao's pattern graphs (tests/peer/torchao_patterns.py, used by every
env where torchao is installed) hands out what a fresh export gives, a copy each time, and
exports afresh what it cannot key safely."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.peer
utils = pytest.importorskip("torchao.quantization.pt2e.utils")
export_utils = pytest.importorskip("torchao.quantization.pt2e.export_utils")

from tests.peer.torchao_patterns import memoized  # noqa: E402


def _conv_bn(x, conv_weight, bn_weight, bn_bias, bn_running_mean, bn_running_var):
    x = F.conv2d(x, conv_weight)
    return F.batch_norm(x, bn_running_mean, bn_running_var, bn_weight, bn_bias, training=True)


def _inputs(size=3):
    return (torch.randn(1, 1, size, size), torch.randn(1, 1, 1, 1), *(torch.randn(1) for _ in range(4)))


def _original():
    """torchao's own function (the session fixture patched the module attribute)."""
    function = utils._get_aten_graph_module_for_pattern
    return getattr(function, "__wrapped__", function)


def _memo():
    stats = {"exported": 0, "reused": 0, "uncached": 0}
    return memoized(_original(), {}, stats), stats


def test_memo_gives_a_fresh_exports_graph_as_a_new_copy_each_time():
    get, stats = _memo()
    pattern = export_utils.WrapperModule(_conv_bn)  # as torchao passes its patterns
    first, second = get(pattern, _inputs()), get(export_utils.WrapperModule(_conv_bn), _inputs())
    fresh = _original()(pattern, _inputs())
    assert stats == {"exported": 1, "reused": 1, "uncached": 0}
    assert first is not second and first.graph is not second.graph
    assert str(first.graph) == str(second.graph) == str(fresh.graph)
    second.graph.erase_node(next(n for n in second.graph.nodes if n.op == "output"))  # a caller's edit
    assert str(get(pattern, _inputs()).graph) == str(fresh.graph)  # the cached graph is untouched


def test_memo_exports_afresh_what_it_cannot_key():
    get, stats = _memo()
    weight = torch.randn(1, 1, 1, 1)

    def holds_a_tensor(x, conv_weight, bn_weight, bn_bias, bn_running_mean, bn_running_var, w=weight):
        return _conv_bn(x, conv_weight + w, bn_weight, bn_bias, bn_running_mean, bn_running_var)

    get(export_utils.WrapperModule(holds_a_tensor), _inputs())
    get(export_utils.WrapperModule(holds_a_tensor), _inputs())
    assert stats == {"exported": 0, "reused": 0, "uncached": 2}
    get(export_utils.WrapperModule(_conv_bn), _inputs())
    get(export_utils.WrapperModule(_conv_bn), _inputs(size=4))  # other shapes: another key
    assert stats == {"exported": 2, "reused": 0, "uncached": 2}


def test_the_session_patch_reaches_executorchs_xnnpack_quantizer():
    """ExecuTorch's XNNPACKQuantizer bound torchao's function by name at import: patched too."""
    xq_utils = pytest.importorskip("executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils")
    assert xq_utils._get_aten_graph_module_for_pattern is utils._get_aten_graph_module_for_pattern
    assert getattr(utils._get_aten_graph_module_for_pattern, "__wrapped__", None) is not None
