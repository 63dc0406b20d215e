"""edgespec.calibrate: token counts, the kept drafter vocabulary, and the samplers' priors.

Python API (the CLI `edgespec calibrate` is a thin layer over it):
    from edgespec.calibrate import CalibrationConfig, calibrate, load_prompts
    doc = calibrate(CalibrationConfig(out=Path("v.json"), sources=["raw"], policy="keep", value=8192,
                                      pair="smollm-self", data=["/usr/lib/python3.11/**/*.py"]))
Building blocks: counts (streaming counts), select (policies, coverage, vocab.json), priors (unigram
prior, affinity M), astar (a* of randomised drafting), generate / teacher (model passes), prompts.
"""
from edgespec.calibrate.prompts import Prompt, load_prompts
from edgespec.calibrate.run import CalibrationConfig, calibrate

__all__ = ["CalibrationConfig", "Prompt", "calibrate", "load_prompts"]
