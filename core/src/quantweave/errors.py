"""Exceptions raised by quantweave. Each subclasses a built-in so callers can catch broadly."""

from __future__ import annotations

__all__ = [
    "AnnotationError",
    "AnnotationConflictError",
    "SharingError",
    "ObserverNotCalibratedError",
    "ConvertError",
    "PluginError",
    "PluginWarning",
    "MisuseWarning",
    "UnknownQuantizerError",
    "SerializationError",
    "CalibrationInputError",
    "NonFiniteDataError",
    "DistributedSyncError",
]


class AnnotationError(ValueError):
    """An annotation is malformed: it names an edge that is not in the graph, a spec of a
    wrong type, or a spec whose observer cannot be built."""


class AnnotationConflictError(AnnotationError):
    """A member of a ComposableQuantizer replaced, removed or mutated an annotation an
    earlier member made (the message names both quantizers and the node)."""


class SharingError(AnnotationError):
    """Shared or derived specs that cannot be resolved: dangling, cyclic, or unresolvable."""


class ObserverNotCalibratedError(RuntimeError):
    """``convert_pt2e`` met observers that never saw data (calibration was skipped)."""


class ConvertError(RuntimeError):
    """``convert_pt2e`` cannot turn an observer into quantize/dequantize ops."""


class PluginError(RuntimeError):
    """A plugin could not be loaded or its quantizer could not be built
    (raised for load failures only with ``QUANTWEAVE_STRICT_PLUGINS=1``)."""


class PluginWarning(UserWarning):
    """A plugin was not loaded; the host carries on without it."""


class MisuseWarning(UserWarning):
    """A call or option that runs but most likely does not do what was meant: a config naming
    a module the model does not have, converting a model that has no observers, a QAT
    quantizer given to ``prepare_pt2e``. The message says what to do; make these errors with
    ``warnings.filterwarnings("error", category=quantweave.MisuseWarning)``."""


class UnknownQuantizerError(LookupError):
    """No installed quantizer has that name (the message lists the available ones)."""


class SerializationError(ValueError):
    """``quantweave.save`` was given a model it cannot save: a prepared model that was not
    converted (the message names its first observer), or not a GraphModule; or
    ``quantweave.load`` a file it cannot load (the message names the file and says what it
    is: not an archive, truncated, a ``torch.save`` state dict, written by a newer quantweave)."""


class CalibrationInputError(ValueError):
    """``quantweave.calibrate`` refused a batch that does not match the exported program's
    inputs (number, names, dtype, rank, sizes, dynamic-size constraints); the message names
    the input (placeholder and position), the batch, what was expected and what was got.
    No observer saw the batch."""


class NonFiniteDataError(ValueError):
    """NaN or infinite values reached an observer during ``quantweave.calibrate`` (the
    message names the observer, the node it observes and the batch); the batch was rolled
    back. ``calibrate(..., non_finite="skip")`` skips such batches instead, with a warning."""


class DistributedSyncError(RuntimeError):
    """``quantweave.distributed`` could not synchronize observers across the process group:
    a rank failed or did not arrive in time, the ranks' observers differ, or an observer type
    cannot be merged (the message names the observers and ranks). Raised on every rank that
    takes part; observers are left as they were."""
