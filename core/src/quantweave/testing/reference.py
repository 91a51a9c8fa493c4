"""Moved to pytest-quantweave (``pytest_quantweave.reference``): the reference quantizer.

This import path keeps working while pytest-quantweave is installed (the module *is*
``pytest_quantweave.reference``); without it, importing it raises an ImportError saying
``pip install pytest-quantweave``.
"""

import sys
from typing import TYPE_CHECKING

from .._modules.kit_moved import moved_to_kit

if TYPE_CHECKING:
    from pytest_quantweave.reference import *  # noqa: F403

sys.modules[__name__] = moved_to_kit("reference")
