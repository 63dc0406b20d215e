"""edgespec.runtime: the torch-free ONNX Runtime + NumPy decoder. See edgespec/__init__.py."""
from edgespec.runtime.bundle.bundle import Bundle
from edgespec.runtime.api.decoder import GenerationResult, SpeculativeDecoder
from edgespec.runtime.samplers.sampling import SamplingParams
from edgespec.runtime.api.stats import GenerationStats

__all__ = ["Bundle", "SpeculativeDecoder", "GenerationResult", "GenerationStats", "SamplingParams"]
