"""Errors of the profiler (`edgespec bench`, `edgespec study`, `edgespec demo`)."""
from edgespec.errors import EdgespecError


class BenchError(EdgespecError):
    """Unusable benchmark input: no usable prompts, unknown category, bad settings, unwritable report dir."""


class StudyError(EdgespecError):
    """Unusable acceptance-study input: no text, no full-head drafter, bad kept sizes or betas."""
