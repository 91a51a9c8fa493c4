"""to_onnx drops the exporter's debug metadata by default (tox env ``onnxruntime``): the same
nodes, initializers and ORT outputs, a smaller file; ``keep_metadata=True`` keeps it."""

import numpy as np
import pytest
import torch

import quantweave as qw
from quantweave_onnxruntime import ORTQuantizer, to_onnx
from quantweave_onnxruntime.testing import CNN, run

onnx = pytest.importorskip("onnx", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")
pytest.importorskip("onnxruntime", reason="needs onnx, onnxscript and onnxruntime (tox -e onnxruntime)")

pytestmark = pytest.mark.onnxruntime


def _strip(model):
    graph = model.graph
    for node in graph.node:
        del node.metadata_props[:]
    del graph.metadata_props[:]
    return graph


def test_to_onnx_drops_the_exporters_debug_metadata_and_ort_computes_the_same(tmp_path):
    torch.manual_seed(0)
    model, x = CNN().eval(), torch.randn(2, 3, 16, 16)
    prepared = qw.prepare_pt2e(torch.export.export(model, (x,)).module(), ORTQuantizer())
    qw.calibrate(prepared, [torch.randn(2, 3, 16, 16) for _ in range(2)], progress=False)
    converted = qw.convert_pt2e(prepared)
    kept = to_onnx(converted, (x,), tmp_path / "kept.onnx", keep_metadata=True)
    dropped = to_onnx(converted, (x,), tmp_path / "dropped.onnx")
    with_meta, without = onnx.load(str(kept)), onnx.load(str(dropped))
    # kept: the exporter's stack traces / FX nodes per node and the program's graph signature
    assert all(any(p.key.startswith("pkg.torch.onnx.") for p in n.metadata_props) for n in with_meta.graph.node)
    assert any(p.key.startswith("pkg.torch.") for p in with_meta.graph.metadata_props)
    # dropped: none of it, everything else the same (nodes, attributes, initializers, value infos)
    assert not any(n.metadata_props for n in without.graph.node)
    assert not any(p.key.startswith("pkg.torch.") for p in without.graph.metadata_props)
    a, b = _strip(with_meta), _strip(without)
    assert a.SerializeToString() == b.SerializeToString()
    assert dropped.stat().st_size < 0.7 * kept.stat().st_size
    np.testing.assert_array_equal(run(kept, x)[0], run(dropped, x)[0])
