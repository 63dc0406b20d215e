"""edgespec.runtime.bundle.bundle: the bundle: reader, manifest, tokenizers, vocabulary tables, chat templates, detokenisation (docs/runtime.md, "Modules")."""
