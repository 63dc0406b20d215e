"""Peers as rows of `edgespec bench --peers`: onnxruntime-genai's own generator on the bundle's target
graph, the plain decoding a user of that stack gets, measured on the same prompts, interleaved with
edgespec's rows, with the same thread count.

The bundle's target directory holds the model builder's genai_config.json. The peer runs the graph
as the builder wrote it: the bundle's model.onnx less the `logits_to_keep` input edgespec adds
(export/last_logits.py; the generator would not feed it), written into a scratch directory beside
hard links (or copies) of the external data, with the thread count set in a copy of the config.
Nothing in the bundle changes. bench closes the peer (removing the directory); the directory's name
records its process (export/workdirs.py), so the next peer removes those a killed bench left.

A peer answers `generate(ids, max_new_tokens=..., temperature=0, ...)` like a decoder, with a
GenerationResult whose stats carry TTFT (the prefill and the first token) and the total time, so the
bench records, summarises and reports it like any row. Greedy only.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import weakref
from pathlib import Path

from edgespec.export.greedy_ids import strip_greedy_ids
from edgespec.export.last_logits import strip_logits_to_keep
from edgespec.export.workdirs import owned_tmpdir, remove_stale_tmpdirs
from edgespec.profiler.peer_llama import LLAMA, LlamaServerPeer, PeerError, target_gguf
from edgespec.runtime.api.decoder import GenerationResult
from edgespec.runtime.engine.sessions import default_threads
from edgespec.runtime.api.stats import GenerationStats

GENAI = "onnxruntime-genai"
PEERS = (GENAI, LLAMA)
GENAI_EPS = {"cuda": "CUDAExecutionProvider"}     # the generator's EP names beside "cpu"
SCRATCH_PREFIX = "edgespec-peer-"


def is_peer(label: str) -> bool:
    return label in PEERS


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


class GenaiPeer:
    """onnxruntime-genai's Generator on a builder bundle's target graph."""

    def __init__(self, target_dir: Path, threads: int | None, ep: str = "cpu"):
        import onnx  # lazy: optional heavy dependencies (edgespec[export])
        import onnxruntime_genai as og  # lazy: onnxruntime-genai: the [export] extra

        self.og = og
        parent = Path(tempfile.gettempdir())
        remove_stale_tmpdirs(parent, re.escape(SCRATCH_PREFIX))     # those of a bench that was killed
        root = owned_tmpdir(parent, SCRATCH_PREFIX)
        self._remove_scratch = weakref.finalize(self, shutil.rmtree, root, True)
        cfg = json.loads((target_dir / "genai_config.json").read_text())
        so = cfg["model"]["decoder"].setdefault("session_options", {})
        so.update({"intra_op_num_threads": int(threads or default_threads()), "inter_op_num_threads": 1})
        # the generator's EP: its config's provider_options (the CPU EP where it names none)
        options = [o for o in so.get("provider_options", []) if ep in o]
        so["provider_options"] = options or ([{ep: {}}] if ep != "cpu" else [])
        self.providers = ["CPUExecutionProvider"] if ep == "cpu" else [GENAI_EPS[ep]]
        graph_name = cfg["model"]["decoder"].get("filename", "model.onnx")
        for f in target_dir.iterdir():
            if f.is_file() and f.name not in ("genai_config.json", graph_name):
                _link_or_copy(f, root / f.name)
        model = onnx.load(str(target_dir / graph_name), load_external_data=False)
        strip_logits_to_keep(model)
        strip_greedy_ids(model)
        onnx.save_model(model, str(root / graph_name))
        (root / "genai_config.json").write_text(json.dumps(cfg, indent=2))
        self.root = root                 # the generator's copy of the graph and its genai_config.json
        self.model = og.Model(str(root))

    def generate(self, ids, max_new_tokens: int, temperature: float = 0.0, **_ignored) -> GenerationResult:
        og = self.og
        t0 = time.perf_counter()
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + max_new_tokens, do_sample=False)
        gen = og.Generator(self.model, params)
        gen.append_tokens(list(ids))              # the prefill
        gen.generate_next_token()
        out = [int(gen.get_next_tokens()[0])]
        ttft = (time.perf_counter() - t0) * 1e3
        while len(out) < max_new_tokens and not gen.is_done():
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        total = (time.perf_counter() - t0) * 1e3
        st = GenerationStats(strategy=GENAI, new_tokens=len(out), prompt_tokens=len(ids), prefill_tokens=1,
                             target_forwards=len(out), verify_forwards=len(out) - 1, total_ms=total, ttft_ms=ttft,
                             stop_reason="eos" if len(out) < max_new_tokens else "length",
                             providers={"target": list(self.providers)})
        return GenerationResult(text="", token_ids=out, stats=st, prompt_token_ids=list(ids))

    def close(self) -> None:
        self.model = None
        self._remove_scratch()


def make_peers(bundle, settings) -> dict:
    """{label: peer}: onnxruntime-genai's generator for `--peers`, llama.cpp's server where
    `--llama-server` names one. A peer that cannot run here is one line on stderr, and the bench runs
    without its row."""
    def skip(label: str, why: str) -> None:
        flag = "--llama-server" if label == LLAMA else "--peers"
        print(f"edgespec: {flag}: {why}; the bench runs without the {label} row", file=sys.stderr)
    if settings.temperature != 0:
        skip("peer", "the peer rows are greedy only (give --temperature 0)")
        return {}
    peers = {}
    genai = _genai_peer(bundle, settings) if settings.peers else None
    if isinstance(genai, str):
        skip(GENAI, genai)
    elif genai is not None:
        peers[GENAI] = genai
    if settings.llama_server:
        if settings.ep != "cpu":
            skip(LLAMA, f"the llama.cpp row runs on the CPU, not {settings.ep}")
            return peers
        try:
            peers[LLAMA] = LlamaServerPeer(settings.llama_server, target_gguf(bundle), settings.threads)
        except (PeerError, OSError) as exc:
            skip(LLAMA, str(exc).splitlines()[0][:200])
    return peers


def _genai_peer(bundle, settings):
    """The onnxruntime-genai peer, or why it cannot run here."""
    if settings.ep not in ("cpu", *GENAI_EPS):
        return f"the onnxruntime-genai row runs the CPU or CUDA EP, not {settings.ep}"
    try:
        import onnxruntime_genai  # noqa: F401  # lazy: onnxruntime-genai: the [export] extra
    except ImportError:
        return "onnxruntime-genai is not installed (pip install 'edgespec[export]')"
    target_dir = Path(bundle.target.onnx).parent
    if not (target_dir / "genai_config.json").is_file():
        return f"{target_dir} has no genai_config.json (an optimum graph; export with --graph builder)"
    try:
        return GenaiPeer(target_dir, settings.threads, settings.ep)
    except Exception as exc:            # the peer's own loader: say why in one line, bench the rest
        return f"onnxruntime-genai could not load the graph ({str(exc).splitlines()[0][:200]})"
