"""The settings of one `edgespec bench` run (the CLI builds them from its flags), and their JSON form,
which the report records and the journal fingerprints."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class BenchSettings:
    bundle: Path
    report: Path
    prompts: str = "humaneval"
    split: str = "test"
    categories: list[str] | None = None
    limit: int | None = None
    strategies: list[str] = field(default_factory=lambda: ["ar", "tli"])
    draft_lengths: list[int] = field(default_factory=lambda: [1, 2, 4])
    max_new_tokens: int = 128
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
    verify: str = "fast"
    progress: bool = True
    resume: bool = False
    command: str = ""

    def configs(self) -> list[tuple[str, int]]:
        """(strategy, draft_length) in measuring order: ar first, then each strategy x draft length."""
        out = [("ar", 0)]
        for s in self.strategies:
            if s != "ar":
                out.extend((s, int(g)) for g in self.draft_lengths)
        return out


def settings_dict(s: BenchSettings) -> dict:
    d = asdict(s)
    d["bundle"], d["report"] = str(s.bundle), str(s.report)
    return d
