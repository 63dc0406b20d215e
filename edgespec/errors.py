"""Error types. Every user-facing failure is an EdgespecError with a one-line message."""


class EdgespecError(Exception):
    """Base class: the CLI prints `edgespec: error: <message>` and exits with code 2."""


class BundleError(EdgespecError):
    """A bundle is missing, corrupt, mismatched or of an unsupported format version."""


class ModelSourceError(EdgespecError):
    """A model source (recipe, directory, GGUF, hub id) cannot be resolved or verified."""


class ExportError(EdgespecError):
    """Export failed; no bundle was written."""


class EPError(EdgespecError):
    """An execution provider is unknown or not active in the created session."""


class GenerationError(EdgespecError):
    """Bad generation input: empty prompt, context overflow, bad sampling parameters."""


class CalibrationError(EdgespecError):
    """Calibration input is unusable (empty corpus, glob matching nothing, bad K/P...)."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name where it has none: what a one-line
    error or warning quotes of a library's multi-line message."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
