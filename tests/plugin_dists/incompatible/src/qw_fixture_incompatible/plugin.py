"""A plugin targeting plugin API 99: it must be refused, not half-loaded."""

from quantweave.hookspecs import hookimpl

QUANTWEAVE_PLUGIN_API = 99


@hookimpl
def quantweave_quantizers():
    raise AssertionError("must never be called: the API version is incompatible")
