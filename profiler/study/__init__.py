"""Offline studies (`edgespec study ...`), one module each: acceptance (acceptance under drafter-vocabulary
pruning), randomised (randomised drafting's a*), samplers (the samplers every study compares), slrs
(SLRS bounds), synthetic (synthetic distributions); report.py writes their reports, cli.py their commands."""
