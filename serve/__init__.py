"""edgespec.serve: an OpenAI-compatible local server (`edgespec serve`) and an interactive chat (`edgespec chat`)."""
