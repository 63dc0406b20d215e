"""edgespec.runtime.api: the API: `SpeculativeDecoder`, one generation's state and phases, the settings and their checks, the engine a decoder builds (docs/runtime.md, "Modules")."""
