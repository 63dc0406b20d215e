"""edgespec.runtime.planning: the plan: the device profile, the pure plan, the decoder's planning over its life, the records it reads (docs/runtime.md, "Modules")."""
