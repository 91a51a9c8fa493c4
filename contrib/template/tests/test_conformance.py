"""quantweave-contrib-template does what it declares:
quantweave's conformance kit (pytest-quantweave), one test per declared capability, one
per quantizer for what it must leave alone (every probe of the pattern vocabulary and a
sweep model), and the installed entry point."""

from pytest_quantweave import conformance_suite

TestConformance = conformance_suite("quantweave_contrib_template.plugin")
