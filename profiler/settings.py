"""The settings of one `edgespec bench` run (the CLI builds them from its flags), and their JSON form,
which the report records and the journal fingerprints.

Defaults that depend on other settings are resolved when the settings are made (`__post_init__`):
- `split` None: "test" for the built-in humaneval set (never the prompts `edgespec calibrate` uses by
  default), "all" for a prompt file the user names (their file, all of it);
- `max_draft_length` None: DEFAULT_MAX_DRAFT_LENGTH (8), or the largest numeric draft length when that is larger (draft_length
  "auto" lets the governor choose gamma in 0..max_draft_length per round; the fixed lengths beside it
  never cap it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgespec.calibrate.prompts import HUMANEVAL
from edgespec.runtime.bundle.bundle import DEFAULT_VERIFY
from edgespec.runtime.api.checks import DEFAULT_MAX_DRAFT_LENGTH, DEFAULT_MAX_NEW_TOKENS

AUTO = "auto"                     # the draft-length entry that runs a strategy with draft_length="auto"
FAST_BASELINE = ("ar-fast", 0)    # ar with 1-token steps: the speed baseline where the graph pads them


def is_auto(gamma) -> bool:
    return isinstance(gamma, str) and gamma == AUTO


def numeric_lengths(values) -> list[int]:
    return [g for g in values or [] if isinstance(g, int) and not isinstance(g, bool)]


def gamma_label(setting) -> str:
    """How a draft-length setting is shown in tables, plots and messages: "auto" or the integer."""
    return AUTO if is_auto(setting) else str(setting)


def gamma_order(setting) -> tuple:
    """Sort key for draft-length settings: numbers ascending, then "auto"."""
    return (1, 0) if is_auto(setting) else (0, setting)


@dataclass
class BenchSettings:
    bundle: Path
    report: Path
    prompts: str = HUMANEVAL
    split: str | None = None                 # None: "test" for humaneval, "all" for a file (see above)
    categories: list[str] | None = None
    limit: int | None = None
    strategies: list[str] = field(default_factory=lambda: ["ar", "auto"])
    draft_lengths: list[int | str] = field(default_factory=lambda: [AUTO])    # ints >= 1 and/or "auto"
    max_draft_length: int | None = None      # None: DEFAULT_MAX_DRAFT_LENGTH, or the largest numeric length
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    ep: str = "cpu"
    draft_ep: str | None = None
    threads: int | None = None
    draft_threads: int | None = None
    repeats: int = 3
    warmup: bool = True
    chat: bool = False
    options: dict = field(default_factory=dict)
    bandwidth_mb: int = 256
    verify: str = DEFAULT_VERIFY
    progress: bool = True
    resume: bool = False
    peers: bool = False                      # onnxruntime-genai's generator as a row (profiler/peers.py)
    llama_server: Path | None = None         # llama.cpp's llama-server on the target's GGUF as a row (peer_llama.py)
    prefill_graph: bool | str = "auto"       # long forwards on the target's prefill graph (runtime/engine/kv.py)
    command: str = ""

    def __post_init__(self):
        if self.split is None:
            self.split = "test" if self.prompts == HUMANEVAL else "all"
        if self.max_draft_length is None:
            self.max_draft_length = max([DEFAULT_MAX_DRAFT_LENGTH, *numeric_lengths(self.draft_lengths)])

    def configs(self) -> list[tuple[str, int | str]]:
        """(strategy, draft-length setting) in measuring order: ar first, then each strategy x draft length
        (an int gamma, or "auto")."""
        out: list[tuple[str, int | str]] = [("ar", 0)]
        for s in self.strategies:
            if s != "ar":
                out.extend((s, g if is_auto(g) else int(g)) for g in self.draft_lengths)
        return out


def settings_dict(s: BenchSettings) -> dict:
    d = asdict(s)
    d["bundle"], d["report"] = str(s.bundle), str(s.report)
    d["llama_server"] = str(s.llama_server) if s.llama_server else None
    return d
