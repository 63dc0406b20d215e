"""edgespec.export: model sources and ONNX bundle export (needs the [export] extra)."""
