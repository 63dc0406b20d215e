"""benchmarks/edits_reuse.py (the held-out edit workload re-sent in fresh conversations) runs end to end
on a tiny bundle for a few tokens: every function's source is found, the splits are disjoint, and every
default output equals ar's or ar-fast's. The real run is on a real bundle (docs/results.md)."""
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import edits_reuse  # noqa: E402


def test_the_requests_and_their_splits():
    calib, test, both = (edits_reuse.requests(s) for s in ("calib", "test", "all"))
    assert len(both) == 2 * len(edits_reuse.FUNCTIONS) == len(calib) + len(test)
    assert not {r[0] for r in calib} & {r[0] for r in test}
    assert [turn for _, turn, _ in both] == [1] * 8 + [2] * 8
    firsts, seconds = both[:8], both[8:]
    assert all(a[0] == b[0] and a[2] != b[2] and "```python\ndef " in a[2] for a, b in zip(firsts, seconds))


def test_it_runs_on_a_tiny_bundle(tiny_self_bundle):
    out = io.StringIO()
    result = edits_reuse.run(tiny_self_bundle, split="all", max_new_tokens=8, threads=1, limit=2, out=out)
    assert not result["mismatches"], out.getvalue()
    assert [r["turn"] for r in result["rows"]] == [1, 1, 2, 2]
    assert result["first"] > 0 and result["second"] > 0
    assert "pooled decode rate vs ar-fast" in out.getvalue()
