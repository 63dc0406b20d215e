"""benchmarks/README.md names every file in benchmarks/ (each script: what it measures and how to run
it; each prompt set: what it holds and who reads it), so that none is documented nowhere."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_benchmark_file_is_in_the_index():
    index = (ROOT / "benchmarks" / "README.md").read_text()
    files = sorted(p.name for p in (ROOT / "benchmarks").iterdir()
                   if p.is_file() and p.name != "README.md" and not p.name.startswith("."))
    missing = [name for name in files if f"`{name}`" not in index]
    assert files and not missing, f"benchmarks/README.md has no entry for {missing}"
