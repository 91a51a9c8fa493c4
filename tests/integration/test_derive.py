"""Capabilities derived by probing, for quantizers that declare none (issue #21).

The truth test: a quantizer that only forwards to quantweave-xnnpack's (and so declares
nothing) is derived to exactly what xnnpack declares -- every stated field -- except the
patterns xnnpack declares unfused (conv2d_hardtanh, conv2d_relu6 and their QAT conv2d_bn_
forms: conv and hardtanh quantized one by one, which derivation reports as the single-op
patterns). Then: caching per
configuration (and by identity when a configuration has no stable rendering), the
``source`` field, ComposableQuantizer and the CLI."""

from __future__ import annotations

import json

import pytest

import quantweave as qw
from quantweave._modules.derive import config_key, declares_capabilities, probe_stats
from quantweave.capabilities import Capability, TensorQuant, derive_capabilities
from quantweave.cli import main
from quantweave.plugin_api import QuantizerInfo, hookimpl
from quantweave.registry import PluginManager
from quantweave_xnnpack.plugin import make_quantizer

UNFUSED = {"conv2d_hardtanh", "conv2d_relu6", "conv2d_bn_hardtanh", "conv2d_bn_relu6"}
FIELDS = ("activation", "weight", "output", "bias", "fused", "input_from")


class Forwarding(qw.Quantizer):
    """Declares nothing: annotates with quantweave-xnnpack's quantizer."""

    def __init__(self, config: object = None, **options: object) -> None:
        self.inner = make_quantizer(**options)
        self.config = config
        self.name = "forwarding"

    def transform_for_annotation(self, model):
        return self.inner.transform_for_annotation(model)

    def annotate(self, model):
        return self.inner.annotate(model)


@pytest.mark.parametrize("options", [{}, {"is_dynamic": True}, {"is_qat": True}], ids=["static", "dynamic", "qat"])
def test_derived_capabilities_are_what_xnnpack_declares(options):
    derived = {c.key: c for c in derive_capabilities(Forwarding(**options))}
    declared = {c.key: c for c in make_quantizer(**options).quantization_capabilities()}
    assert {key for key in declared if key[0] not in UNFUSED} == set(derived)
    for key, cap in derived.items():
        assert cap.source == "derived"
        for name in FIELDS:
            stated = getattr(declared[key], name)
            assert stated is None or stated == getattr(cap, name), (key, name, stated, getattr(cap, name))


def test_derivation_is_cached_per_configuration():
    first = derive_capabilities(Forwarding())
    assert derive_capabilities(Forwarding()) is first  # another object, configured alike
    per_channel = derive_capabilities(Forwarding(is_per_channel=True))  # the default is per tensor
    assert per_channel is not first
    assert {c.pattern: c for c in first}["conv2d"].weight.granularity == "per_tensor"
    assert {c.pattern: c for c in per_channel}["conv2d"].weight.granularity == "per_channel"
    stats = probe_stats(Forwarding())
    assert stats is not None and stats.derived == len(first) and stats.probes > 40 and not stats.left_out


def test_a_configuration_without_stable_rendering_is_cached_by_identity():
    quantizer = Forwarding(config=object())  # shows only its address: no key
    assert config_key(quantizer) is None
    caps = derive_capabilities(quantizer)
    assert derive_capabilities(quantizer) is caps
    assert derive_capabilities(Forwarding(config=object())) is not caps


def test_what_counts_as_declaring():
    assert not declares_capabilities(Forwarding())
    assert declares_capabilities(make_quantizer())
    assert not declares_capabilities(object())  # a foreign quantizer: no such hook


def test_source_is_validated_and_serialised():
    act = TensorQuant("int8", -128, 127)
    with pytest.raises(ValueError, match=r"source.*'guessed'"):
        Capability("linear", "static", act, source="guessed")
    cap = Capability("linear", "static", act, source="derived")
    assert Capability.from_dict(cap.to_dict()).source == "derived"
    assert Capability.from_dict({k: v for k, v in cap.to_dict().items() if k != "source"}).source == "declared"


def test_composition_merges_derived_capabilities_like_declared_ones():
    class Declaring(Forwarding):
        def quantization_capabilities(self):
            return ()  # declares, and declares nothing: not probed

    rows = {(r.pattern, r.mode.value): r for r in qw.ComposableQuantizer([Forwarding()]).capability_table()}
    assert rows[("conv2d_relu", "static")].served_by == "forwarding"
    assert rows[("conv2d_relu", "static")].capability.source == "derived"
    assert qw.ComposableQuantizer([Declaring()]).capability_table() == []


def test_cli_marks_derived_capabilities(capsys):
    class Plugin:
        QUANTWEAVE_PLUGIN_API = 2

        @hookimpl
        def quantweave_quantizers(self):
            return [QuantizerInfo(name="fwd", factory=Forwarding)]

    pm = PluginManager(entry_points=[], strict=False)
    assert pm.register("fwdplugin", Plugin()).status == "loaded"
    assert main(["capabilities", "--plugin", "fwdplugin"], manager=pm) == 0
    out = capsys.readouterr().out
    assert "static*" in out and "*: derived by probing" in out
    assert main(["capabilities", "--plugin", "fwdplugin", "--json"], manager=pm) == 0
    records = json.loads(capsys.readouterr().out)
    assert records and all(r["source"] == "derived" and r["quantizer"] == "fwd" for r in records)
    assert main(["capabilities", "--plugin", "fwdplugin", "--details"], manager=pm) == 0
    assert "fwdplugin:fwd (derived)" in capsys.readouterr().out
