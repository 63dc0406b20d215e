"""edgespec.runtime: the torch-free ONNX Runtime + NumPy decoder. See edgespec/__init__.py."""
from edgespec.runtime.bundle import Bundle
from edgespec.runtime.decoder import GenerationResult, SpeculativeDecoder
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.stats import GenerationStats

__all__ = ["Bundle", "SpeculativeDecoder", "GenerationResult", "GenerationStats", "SamplingParams"]
