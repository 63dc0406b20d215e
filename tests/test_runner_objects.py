"""A model runner is small objects behind one interface (runtime/kv*.py): each class keeps at most
MAX_ATTRIBUTES instance attributes, no runtime module reads another object's underscore members, the two
KV layouts answer the same methods, and `min_tokens=` sets the forward width the caller chose."""
import ast
from pathlib import Path

import pytest

from edgespec.runtime import Bundle
from edgespec.runtime.engine.kv import ModelRunner
from edgespec.runtime.engine.kv_copy import CopyLayout
from edgespec.runtime.engine.kv_shared import SharedLayout
from edgespec.runtime.engine.sessions import create_session

ROOT = Path(__file__).resolve().parents[1]
MAX_ATTRIBUTES = 15
# reads of another object's underscore member in runtime/ that predate this check, by module; each one
# here is a debt to pay, and no new one may join them
KNOWN_PRIVATE_READS: dict[str, set[str]] = {}
INTERPRETER = {"sys._current_frames"}        # CPython's documented introspection, not an object's state


def instance_attributes(cls: ast.ClassDef) -> set[str]:
    """Names a class's methods assign as `self.X` (plain, annotated, augmented or tuple targets), and its
    annotated class-level fields (a dataclass's)."""
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def private_reads(source: str) -> set[str]:
    """`x._name` where x is not `self` or `cls` (dunders aside): a read of another object's internals."""
    return {ast.unparse(n) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.endswith("__")
            and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))}


@pytest.mark.parametrize("path", sorted((ROOT / "runtime" / "engine").glob("kv*.py")), ids=lambda p: p.name)
def test_every_runner_class_keeps_few_attributes(path):
    classes = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]
    assert classes
    big = {c.name: sorted(names) for c in classes if len(names := instance_attributes(c)) > MAX_ATTRIBUTES}
    assert not big, f"{path.name}: classes with more than {MAX_ATTRIBUTES} attributes: {big}"


def test_no_runtime_module_reads_another_objects_underscore_members():
    found = {p.name: reads for p in sorted((ROOT / "runtime").rglob("*.py"))
             if (reads := private_reads(p.read_text()) - INTERPRETER - KNOWN_PRIVATE_READS.get(p.name, set()))}
    assert not found, f"reads of other objects' underscore members: {found}"


def test_the_scans_above_can_fail():
    made_up = ast.parse("class Big:\n    def __init__(self):\n"
                        + "".join(f"        self.a{i} = {i}\n" for i in range(MAX_ATTRIBUTES))
                        + "        self.b, self.c = 1, 2\n        self.a0 += 1\n")
    assert len(instance_attributes(made_up.body[0])) == MAX_ATTRIBUTES + 2
    assert private_reads("x = runner._kv\ny = self._own\nz = type(a).__name__\n") == {"runner._kv"}


def _session(path: Path, side: str = "target"):
    b = Bundle.load(path)
    return b, create_session(getattr(b, side).onnx, "cpu", threads=1)[0]


def test_both_layouts_answer_the_same_methods(tiny_same_bundle):
    """The runner calls only these on its `kv`; each layout has them all, and each is used for its graph."""
    interface = {"length", "capacity", "reset", "crop", "reserve", "attach", "arrays", "run"}
    _, session = _session(tiny_same_bundle)
    shared, copying = ModelRunner(session, "target").kv, ModelRunner(session, "target", kv="copy").kv
    assert isinstance(shared, SharedLayout) and isinstance(copying, CopyLayout)
    assert all(hasattr(layout, name) for layout in (shared, copying) for name in interface)


def test_min_tokens_sets_the_forward_width(tiny_padded_bundle):
    """None: the graph's declared width (here 2: the int4 target's 1-token path differs); an int: that
    width exactly, whatever the graph declares; shorter forwards are fed padded to it, and the padding
is dropped from the cache and the logits."""
    b, session = _session(tiny_padded_bundle)
    declared, one, three = (ModelRunner(session, "target", min_tokens=m) for m in (None, 1, 3))
    assert (declared.min_tokens, one.min_tokens, three.min_tokens) == (2, 1, 3)
    assert ModelRunner(session, "target", exact=False).min_tokens == 1
    assert ModelRunner(session, "target", exact=False, min_tokens=2).min_tokens == 2
    ids = b.target.tokenizer.encode("def quicksort(items):").ids
    for r in (declared, one, three):
        r.forward(ids)
    steps = {r.min_tokens: (r.forward(ids[:1]).copy(), r.tokens_fed, r.length) for r in (declared, one, three)}
    assert {k: fed - len(ids) for k, (_, fed, _) in steps.items()} == {2: 2, 1: 1, 3: 3}   # padded widths fed
    assert all(length == len(ids) + 1 and row.shape[0] == 1 for row, _, length in steps.values())  # padding dropped
    with pytest.raises(ValueError, match="min_tokens"):
        ModelRunner(session, "target", min_tokens=0)
