"""edgespec.runtime.samplers: the samplers: the laws (TLI, RDK, verify, sampling), the grammar's masks, prompt lookup and the answer store (docs/runtime.md, "Modules")."""
