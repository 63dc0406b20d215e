"""edgespec: fast, lossless speculative decoding on edge devices.

Subpackages (each in its own top-level folder, mapped in pyproject.toml):
  edgespec.runtime    torch-free ORT + NumPy decoder (Bundle, SpeculativeDecoder)
  edgespec.export     model sources and ONNX bundle export (needs the [export] extra)
  edgespec.calibrate  token counts, kept vocabulary, samplers' priors
  edgespec.profiler    benchmarks, MBSU, reports
  edgespec.models     model and pair recipes (TOML)
"""
from edgespec.errors import EdgespecError

__version__ = "0.1.0"
__all__ = ["EdgespecError", "__version__"]
