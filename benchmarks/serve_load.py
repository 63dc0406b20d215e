"""Load benchmark of `edgespec serve` with the real openai client (streamed chat completions).

1. Server overhead: single client, greedy, the same prompts through the in-process API
   (`SpeculativeDecoder.generate`) and through the server (non-streamed requests), interleaved so
   that machine noise hits both alike; reports the median ratio of end-to-end time and of decode time
   (end to end minus time to first token) per request. Target: the server adds <= 3%.
2. Concurrency 1, 4, 16: `--requests` streamed requests spread over C concurrent clients; tokens/s
   (completion tokens / wall time) and p50/p95 TTFT (client side: queue wait included).
3. With `--llama-server BIN --gguf FILE`, the same client and prompts against llama.cpp's llama-server
   on that GGUF (same max tokens, greedy), side by side; otherwise it says it was not measured.

    python benchmarks/serve_load.py --bundle bundles/qwen-coder-int4 --max-tokens 64 --requests 8
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
LLAMA_SERVER = Path("/work/llamacpp/build/bin/llama-server")


def prompts(path: Path, limit: int) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(json.loads(line)["turns"][0])
    return out[:limit]


class Proc:
    """A server subprocess; ready when `ready_line` shows up in its output (or /health answers)."""

    def __init__(self, cmd: list[str], url_from_line, ready_timeout: float = 600):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.url = None
        ready = threading.Event()

        def drain():
            for line in self.proc.stdout:
                self.lines.append(line)
                url = url_from_line(line)
                if url and not self.url:
                    self.url = url
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        ready.wait(ready_timeout)
        if not self.url or self.proc.poll() is not None:
            self.stop()
            raise SystemExit("server did not start:\n" + "".join(self.lines[-20:]))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def start_edgespec(args) -> Proc:
    cmd = [sys.executable, "-m", "edgespec", "serve", "--bundle", args.bundle, "--port", "0", "--model-name", "m",
           "--max-queue", "64", "--max-tokens-cap", str(args.max_tokens), "--strategy", args.strategy,
           "--draft-length", args.draft_length]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return Proc(cmd, lambda line: ("http://" + line.rsplit("http://", 1)[1].split()[0])
                if line.startswith("edgespec serve:") else None)


def start_llama(args) -> Proc:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [args.llama_server, "-m", args.gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads or 2),
           "-np", "1", "-c", "4096", "--alias", "m"]
    url = f"http://127.0.0.1:{port}"
    proc = Proc(cmd, lambda line: url if "listening on http" in line or "server is listening" in line else None)
    return proc


def overhead(args, url: str, texts: list[str]) -> dict:
    """Interleaved single-client runs: in-process generate vs the server's non-streamed request."""
    from edgespec.runtime import Bundle
    from edgespec.runtime.arguments import add_decoder_arguments
    from edgespec.serve.server import make_decoder
    parser = argparse.ArgumentParser()
    add_decoder_arguments(parser)            # the server's own decoder arguments
    ns = parser.parse_args(["--bundle", str(args.bundle), "--strategy", args.strategy, "--draft-length",
                            str(args.draft_length), "--prefill-graph", "off"]
                           + (["--threads", str(args.threads)] if args.threads else []))
    dec = make_decoder(Bundle.load(args.bundle, verify="fast"), ns, defer_drafter=False)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    ratios_total, ratios_decode, rows = [], [], []
    for rep in range(args.repeats + 1):          # repeat 0 warms both up and is not counted
        for text in texts:
            msgs = [{"role": "user", "content": text}]

            def local():
                t = time.perf_counter()
                return dec.generate(msgs, max_new_tokens=args.max_tokens, chat=True), time.perf_counter() - t

            def remote():
                t = time.perf_counter()
                return (client.chat.completions.create(model="m", messages=msgs, max_tokens=args.max_tokens,
                                                       temperature=0), time.perf_counter() - t)

            if rep % 2:            # alternate which side runs first, so that order effects cancel
                (got, remote_s), (res, local_s) = remote(), local()
            else:
                (res, local_s), (got, remote_s) = local(), remote()
            local_decode = local_s - res.stats.ttft_ms / 1e3
            ext = got.model_extra["edgespec"]
            remote_decode = remote_s - (ext["ttft_ms"] + ext["queue_ms"]) / 1e3
            same = got.choices[0].message.content == res.text
            if rep:
                ratios_total.append(remote_s / local_s)
                ratios_decode.append(remote_decode / local_decode)
                rows.append({"tokens": len(res.token_ids), "local_s": local_s, "server_s": remote_s, "same": same})
    dec.close()
    return {"requests": len(rows), "all_identical": all(r["same"] for r in rows),
            "median_total_ratio": statistics.median(ratios_total),
            "median_decode_ratio": statistics.median(ratios_decode),
            "local_tok_s": sum(r["tokens"] for r in rows) / sum(r["local_s"] for r in rows),
            "server_tok_s": sum(r["tokens"] for r in rows) / sum(r["server_s"] for r in rows)}


async def level(url: str, texts: list[str], clients: int, requests: int, max_tokens: int) -> dict:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=1800)
    todo = list(range(requests))
    ttfts, tokens, errors = [], [], []

    async def one(i: int):
        t = time.perf_counter()
        first, n = None, 0
        try:
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": texts[i % len(texts)]}], max_tokens=max_tokens,
                temperature=0, stream=True, stream_options={"include_usage": True})
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content and first is None:
                    first = time.perf_counter() - t
                if chunk.usage:
                    n = chunk.usage.completion_tokens
        except openai.APIError as exc:
            errors.append(str(exc)[:100])
            return
        ttfts.append(first if first is not None else time.perf_counter() - t)
        tokens.append(n)

    async def worker():
        while todo:
            await one(todo.pop(0))

    t0 = time.perf_counter()
    async with client:          # closed inside the loop (not at interpreter exit: "Event loop is closed")
        await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - t0
    q = statistics.quantiles(ttfts, n=20) if len(ttfts) > 1 else ttfts * 19
    return {"clients": clients, "requests": requests, "completed": len(tokens), "errors": errors,
            "tokens": sum(tokens), "wall_s": wall, "tok_s": sum(tokens) / wall,
            "ttft_p50_s": statistics.median(ttfts), "ttft_p95_s": q[18]}


def run_levels(url: str, texts: list[str], args) -> list[dict]:
    return [asyncio.run(level(url, texts, c, max(args.requests, c), args.max_tokens)) for c in args.clients]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--prompts", default=str(ROOT / "benchmarks" / "mixed.jsonl"))
    ap.add_argument("--limit", type=int, default=4, help="prompts used (default 4)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=16, help="streamed requests per concurrency level (at least one per client)")
    ap.add_argument("--clients", default="1,4,16", help="concurrency levels ('none': only the overhead runs)")
    ap.add_argument("--repeats", type=int, default=1, help="overhead runs per prompt (after one warm-up)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--strategy", default="auto", help="both sides (default auto; a fixed one, e.g. ar, takes the "
                                                       "governor's run-to-run choices out of the overhead figure)")
    ap.add_argument("--draft-length", default="auto")
    ap.add_argument("--llama-server", default=str(LLAMA_SERVER) if LLAMA_SERVER.exists() else None)
    ap.add_argument("--gguf", default=None, help="GGUF for llama-server (the bundle's source model)")
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args(argv)
    args.clients = [] if args.clients == "none" else [int(c) for c in args.clients.split(",")]
    texts = prompts(Path(args.prompts), args.limit)
    result: dict = {"bundle": args.bundle, "max_tokens": args.max_tokens, "prompts": len(texts)}
    srv = start_edgespec(args)
    try:
        print(srv.lines[-1].strip(), flush=True)
        result["overhead"] = overhead(args, srv.url, texts)
        print("overhead:", json.dumps(result["overhead"]), flush=True)
        result["edgespec"] = run_levels(srv.url, texts, args)
        for r in result["edgespec"]:
            print("edgespec:", json.dumps(r), flush=True)
    finally:
        result["edgespec_exit"] = srv.stop()
    if args.llama_server and args.gguf and os.path.exists(args.llama_server) and args.clients:
        llama = start_llama(args)
        try:
            result["llama_server"] = run_levels(llama.url, texts, args)
            for r in result["llama_server"]:
                print("llama-server:", json.dumps(r), flush=True)
        finally:
            llama.stop()
    else:
        result["llama_server"] = "not measured: " + ("no llama-server binary" if not args.llama_server or not
                                                     os.path.exists(args.llama_server) else "no --gguf given")
        print("llama-server:", result["llama_server"])
    print(f"{'stack':<12} {'clients':>7} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p95':>9} {'done':>5}")
    for name in ("edgespec", "llama_server"):
        for r in result[name] if isinstance(result[name], list) else []:
            print(f"{name:<12} {r['clients']:>7} {r['tok_s']:>7.1f} {r['ttft_p50_s']:>8.2f}s {r['ttft_p95_s']:>8.2f}s "
                  f"{r['completed']:>2}/{r['requests']}")
    o = result["overhead"]
    print(f"server / in-process, single client: end to end x{o['median_total_ratio']:.3f}, decode "
          f"x{o['median_decode_ratio']:.3f} (median of {o['requests']}); identical text: {o['all_identical']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
