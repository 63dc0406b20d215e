"""`edgespec generate` (runtime/cli.py) in-process on the tiny bundles."""
import json

from edgespec.cli import main
from edgespec.runtime import SpeculativeDecoder


def test_generate_cli_matches_the_api(tiny_same_bundle, capsys):
    args = ["generate", "--bundle", str(tiny_same_bundle), "--prompt", "The quick", "--max-new-tokens", "12",
            "--draft-length", "3", "--threads", "1", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    ref = SpeculativeDecoder(tiny_same_bundle, strategy="ar", threads=1).generate("The quick", max_new_tokens=12)
    assert out["token_ids"] == ref.token_ids and out["text"] == ref.text
    assert out["stats"]["strategy"] == "ngram-tli" and out["stats"]["new_tokens"] == len(ref.token_ids)


def test_generate_cli_stream_and_stats(tiny_hetero_bundle, capsys):
    args = ["generate", "--bundle", str(tiny_hetero_bundle), "--prompt", "The quick", "--max-new-tokens", "8",
            "--temperature", "1", "--seed", "3", "--stream", "--stats", "--threads", "1"]
    assert main(args) == 0
    cap = capsys.readouterr()
    ref = SpeculativeDecoder(tiny_hetero_bundle, threads=1).generate("The quick", max_new_tokens=8, temperature=1.0,
                                                                     seed=3)
    assert cap.out == ref.text + "\n"
    assert "slem k=auto" in cap.err and "tau" in cap.err      # the default strategy "auto" is slem on a hetero pair


def test_generate_cli_errors_exit_2(tiny_hetero_bundle, capsys):
    assert main(["generate", "--bundle", str(tiny_hetero_bundle), "--prompt", "x", "--strategy", "sd"]) == 2
    assert "edgespec: error: strategy 'sd' needs a same-tokenizer bundle" in capsys.readouterr().err
    assert main(["generate", "--bundle", str(tiny_hetero_bundle), "--prompt", "x", "--ep", "npu"]) == 2
    assert "unknown execution provider" in capsys.readouterr().err
    assert main(["generate", "--bundle", str(tiny_hetero_bundle), "--prompt", "x", "--draft-probability", "lots"]) == 2
