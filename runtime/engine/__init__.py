"""edgespec.runtime.engine: the engine: ORT sessions, the KV runner and its layouts, placement and probes, the prefix cache, thread scaling (docs/runtime.md, "Modules")."""
