"""SLRS (heterogeneous-vocabularies paper, Alg. 3) measured on a real pair: acceptance and cost.

    python -m edgespec.profiler.study.slrs --pair qwen-smollm --positions 1000 --out OUT

Teacher-forced over the held-out split of the acceptance study's texts (profiler/study/acceptance.py: same
texts, same aligned positions, full drafter vocabulary). Strings and "the first target token of a
string" (longest target token prefixing it) are those of calibrate/prefix_affinity.py. Per position:
  tli       sum_t min(p, q'), q' = q restricted to T and renormalised (Alg. 4);
  slrs-1    psi_1(t) = sum_{d: first(d) = t} q(d): SLRS with a lookahead of one drafter token;
  slrs-2    the `top` drafter tokens d1 of largest q that some target token extends (so one token does
            not fix the first target token) get a second drafter step, one batched forward of `top`
            branches on the cached prefix: psi_2 = psi_1 - sum_{d1} q(d1) e_first(d1)
            + sum_{d1} q(d1) sum_{d2} q(d2 | d1) e_T(s_d1 + s_d2), T = the target tokenizer's first token
            (SecondStep). Every other d1 keeps its psi_1 mapping: a state-dependent lookahead, which
            Alg. 3 allows, so this is a lossless SLRS.
Cost (Appendix D): for every target token t, the number of drafter-token sequences spelling s_t exactly
and the nodes of their prefix tree (drafter forwards needed to evaluate psi(t) exactly, not counting
sequences whose last token runs past t: a lower bound), averaged over the target tokens of the text.
Writes OUT/slrs.json and prints a table. Torch drafter only (the branch forward needs its KV cache).
"""
from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from edgespec.calibrate.forced_logits import text_sequences
from edgespec.calibrate.pair import resolve_models
from edgespec.calibrate.prefix_affinity import MAX_KEY_BYTES, TokenStructure
from edgespec.profiler.study.acceptance import StudyConfig, study_texts
from edgespec.profiler.study.samplers import overlap
from edgespec.runtime.samplers.sampling import softmax


# --------------------------------------------------------------------------- string structure

def segment_counts(s: bytes, vocab: dict) -> tuple[float, float]:
    """(sequences of vocab keys spelling s exactly, nodes of their prefix tree incl. the root)."""
    n = min(len(s), MAX_KEY_BYTES)
    ways = [1.0] + [0.0] * n
    for j in range(1, n + 1):
        ways[j] = sum(ways[i] for i in range(max(0, j - MAX_KEY_BYTES), j) if ways[i] and s[i:j] in vocab)
    return ways[n], float(sum(ways[:n]))


class SecondStep:
    """psi contribution of a two-token draft d1 d2: the TARGET TOKENIZER's first token of s_d1 + s_d2 for the
    drafter tokens d2 holding `exact_mass` of q(. | d1) (at most `exact_max` of them), the longest target
    token prefixing it for the rest (any fixed map keeps SLRS lossless; psi is computed with the same map)."""

    CACHED_MAPPINGS = 512

    def __init__(self, structure: TokenStructure, target_tok, exact_mass: float = 0.99, exact_max: int = 256):
        self.s = structure
        self.tok = target_tok
        self.exact_mass, self.exact_max = exact_mass, exact_max
        keyed = sorted((k, i) for i, k in enumerate(structure.d_keys) if k)
        self.sorted_keys = [k for k, _ in keyed]
        self.sorted_ids = np.array([i for _, i in keyed], dtype=np.int64)
        self.extensions: dict = {}
        for t, d in zip(structure.extends_rows.tolist(), structure.extends_ids.tolist()):
            self.extensions.setdefault(d, []).append(t)
        self.cache: OrderedDict = OrderedDict()
        self.exact: dict = {}
        self.disagree = [0, 0]                      # (tokenizer != longest prefix, pairs tokenised)

    def mapping(self, d1: int) -> np.ndarray:
        """[V_d] target id: the longest target token prefixing s_d1 + s_d2 (first(d1) where none extends)."""
        if d1 in self.cache:
            self.cache.move_to_end(d1)
        else:
            s = self.s
            out = np.full(s.first.size, s.first[d1], dtype=np.int32)
            head = s.d_keys[d1]
            exts = sorted(self.extensions.get(int(s.canonical[d1]), []), key=lambda t: len(s.t_keys[t]))
            for t in exts:                                  # longer targets overwrite shorter ones
                rest = s.t_keys[t][len(head):]
                lo = bisect.bisect_left(self.sorted_keys, rest)
                hi = bisect.bisect_right(self.sorted_keys, rest + b"\xff" * MAX_KEY_BYTES)
                out[self.sorted_ids[lo:hi]] = t
            self.cache[d1] = out
            if len(self.cache) > self.CACHED_MAPPINGS:              # bounded memory: [V_d] int32 each
                self.cache.popitem(last=False)
        return self.cache[d1]

    def first_tokens(self, d1: int, d2s: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        """The target tokenizer's first token of s_d1 + s_d2 (fallback where the bytes are not UTF-8 text)."""
        todo = [int(d2) for d2 in d2s if (d1, int(d2)) not in self.exact]
        texts, keys = [], []
        for d2 in todo:
            k2 = self.s.d_keys[d2]
            try:
                texts.append((self.s.d_keys[d1] + (k2 or b"")).decode("utf-8"))
                keys.append(d2)
            except UnicodeDecodeError:
                self.exact[(d1, d2)] = -1
        for d2, enc in zip(keys, self.tok.encode_batch(texts, add_special_tokens=False) if texts else []):
            self.exact[(d1, d2)] = enc.ids[0] if enc.ids else -1
        out = np.array([self.exact[(d1, int(d2))] for d2 in d2s], dtype=np.int64)
        return np.where(out >= 0, out, fallback)

    def psi(self, d1: int, q2: np.ndarray, n_target: int) -> np.ndarray:
        """sum_{d2} q(d2 | d1) e_first(s_d1 + s_d2) over the target ids."""
        base = self.mapping(d1)
        order = np.argsort(-q2)[: self.exact_max]
        top = order[: int(np.searchsorted(np.cumsum(q2[order]), self.exact_mass)) + 1]
        exact = self.first_tokens(d1, top, base[top])
        self.disagree[0] += int((exact != base[top]).sum())
        self.disagree[1] += int(top.size)
        psi = np.bincount(base, weights=q2, minlength=n_target)
        np.subtract.at(psi, base[top], q2[top])
        np.add.at(psi, exact, q2[top])
        return psi


# --------------------------------------------------------------------------- drafter with branches

class BranchingDrafter:
    """Torch drafter: logits of a whole sequence, then one extra step for several candidate tokens."""

    def __init__(self, hf_dir: Path):
        import torch  # lazy: optional (edgespec[export]) and heavy
        from transformers import AutoModelForCausalLM  # lazy: the [export] extra

        torch.set_num_threads(1)                            # docs/facts.md [Threads]
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        self.past = None

    def sequence(self, ids: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.no_grad():
            out = self.model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None], use_cache=True)
        self.past = out.past_key_values
        if any(layer.keys.shape[-2] != len(ids) for layer in self.past.layers):
            raise ValueError("a sliding-window cache dropped part of the sequence: lower --max-len")
        return out.logits[0].float().numpy()

    def branches(self, row: int, tokens: np.ndarray) -> np.ndarray:
        """Logits after ids[:row + 1] + [token] for each token (the prefix's cache, repeated)."""
        from transformers import DynamicCache  # lazy: see __init__

        torch = self.torch
        m = int(tokens.size)
        cache = DynamicCache()
        for li, layer in enumerate(self.past.layers):
            cache.update(layer.keys[:, :, :row + 1].repeat(m, 1, 1, 1),
                         layer.values[:, :, :row + 1].repeat(m, 1, 1, 1), li)
        with torch.no_grad():
            out = self.model(input_ids=torch.as_tensor(tokens, dtype=torch.long)[:, None], past_key_values=cache,
                             attention_mask=torch.ones((m, row + 2), dtype=torch.long),
                             position_ids=torch.full((m, 1), row + 1, dtype=torch.long), use_cache=False)
        return out.logits[:, 0].float().numpy()


# --------------------------------------------------------------------------- the measurement

def psi_one(q: np.ndarray, first: np.ndarray, n_target: int) -> np.ndarray:
    has = first >= 0
    return np.bincount(first[has], weights=q[has], minlength=n_target)


def measure(cfg: StudyConfig, top: int) -> dict:
    t0 = time.time()
    _, held, text_desc = study_texts(cfg)
    models = resolve_models(cfg)
    structure = TokenStructure(models.t_tok, models.d_tok, models.v_t, models.v_d)
    second = SecondStep(structure, models.t_tok)
    d2t = np.asarray(models.d2t, dtype=np.int64)
    target_fn = models.target_logits()
    drafter = BranchingDrafter(models.hf_dir("drafter"))
    rows: dict = {"tli": [], "union": [], "slrs-1": [], "slrs-2": []}
    branch_mass, target_tokens = [], []
    for seq in text_sequences(held, cfg.max_len, models.t_tok, models.d_tok):
        if seq is None:
            continue
        pairs = seq.pairs[: cfg.positions - len(rows["tli"])]
        p_all = softmax(target_fn(seq.target_ids, pairs[:, 0]), cfg.temperature, np.float64)
        d_logits = drafter.sequence(seq.drafter_ids)
        target_tokens.extend(seq.target_ids[pairs[:, 0] + 1].tolist())
        for (_, d_row), p in zip(pairs, p_all):
            q = softmax(d_logits[d_row][None, :models.v_d], cfg.temperature, np.float64)[0]
            tli = np.bincount(d2t[d2t >= 0], weights=q[d2t >= 0], minlength=models.v_t)
            rows["union"].append(float(overlap(p, tli)))
            rows["tli"].append(float(overlap(p, tli / tli.sum())))
            psi1 = psi_one(q, structure.first, models.v_t)
            rows["slrs-1"].append(float(overlap(p, psi1)))
            cand = np.flatnonzero(structure.extended & (structure.first >= 0))
            pick = cand[np.argsort(-q[cand])[:top]]
            psi2 = psi1.copy()
            q2 = softmax(drafter.branches(int(d_row), pick)[:, :models.v_d], cfg.temperature, np.float64)
            for d1, q2_row in zip(pick, q2):
                psi2[structure.first[d1]] -= q[d1]
                psi2 += q[d1] * second.psi(int(d1), q2_row, models.v_t)
            rows["slrs-2"].append(float(overlap(p, psi2)))
            branch_mass.append(float(q[pick].sum()))
        if len(rows["tli"]) >= cfg.positions:
            break
    doc = summarise(cfg, models, structure, rows, branch_mass, target_tokens, top, text_desc, time.time() - t0)
    doc["second_step_pairs_tokenised"], doc["second_step_tokenizer_differs_from_longest_prefix"] = \
        second.disagree[1], second.disagree[0]
    return doc


def summarise(cfg, models, structure, rows, branch_mass, target_tokens, top, text_desc, elapsed) -> dict:
    arrays = {k: np.asarray(v) for k, v in rows.items()}
    n = arrays["tli"].size

    def se(a):
        return float(a.std() / np.sqrt(a.size))

    table = {k: {"alpha": float(a.mean()), "alpha_se": se(a), "delta_vs_tli": float((a - arrays["tli"]).mean()),
                 "delta_vs_tli_se": se(a - arrays["tli"])} for k, a in arrays.items()}
    table["slrs-2"]["delta_vs_slrs1"] = float((arrays["slrs-2"] - arrays["slrs-1"]).mean())
    table["slrs-2"]["delta_vs_slrs1_se"] = se(arrays["slrs-2"] - arrays["slrs-1"])
    seg = [segment_counts(k, structure.d_index) if k else (0.0, 0.0) for k in structure.t_keys]
    ways = np.array([s[0] for s in seg])
    nodes = np.array([s[1] for s in seg])
    text_ids = np.asarray(target_tokens, dtype=np.int64)
    has_key = np.array([bool(k) for k in structure.t_keys])
    cost = {"target_tokens_with_text": int(has_key.sum()),
            "spellable_exactly": int((ways[has_key] > 0).sum()),
            "sequences_per_token": _stats(ways[has_key]), "tree_nodes_per_token": _stats(nodes[has_key]),
            "sequences_per_text_token": _stats(ways[text_ids]), "tree_nodes_per_text_token": _stats(nodes[text_ids]),
            "mean_target_token_bytes": float(np.mean([len(k) for k in structure.t_keys if k])),
            "mean_drafter_token_bytes": float(np.mean([len(k) for k in structure.d_keys if k]))}
    return {"format": "edgespec-slrs-study", "pair": models.pair, "texts": text_desc, "positions": n,
            "top_extended_branches": top, "branch_mass": {"mean": float(np.mean(branch_mass))},
            "extended_drafter_tokens": int(structure.extended.sum()), "drafter_vocab": models.v_d,
            "samplers": table, "cost": cost, "elapsed_s": round(elapsed, 1),
            "command": " ".join(["python -m edgespec.profiler.study.slrs", *sys.argv[1:]])}


def _stats(a: np.ndarray) -> dict:
    a = np.asarray(a, dtype=np.float64)
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "max": float(a.max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgespec.profiler.study.slrs", description=__doc__.split("\n")[0])
    ap.add_argument("--pair", required=True)
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--positions", type=int, default=1000)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--top", type=int, default=8, help="drafter tokens that get a second step (default 8)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    cfg = StudyConfig(out=args.out, pair=args.pair, prompts=args.prompts, positions=args.positions,
                      max_len=args.max_len)
    doc = measure(cfg, args.top)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slrs.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print("| sampler | alpha ± SE | vs tli ± SE |\n|---|---|---|")
    for k, r in doc["samplers"].items():
        print(f"| {k} | {r['alpha']:.3f} ± {r['alpha_se']:.3f} "
              f"| {r['delta_vs_tli']:+.4f} ± {r['delta_vs_tli_se']:.4f} |")
    print(json.dumps(doc["cost"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
