"""The 95% Wilson interval every success rate is reported with, in one place.

Why in `memory`: the evaluations the store keeps are success rates, and everything that reads or writes
them -- the validation gate and the reports (`distill`, `agent_runtime`), the dashboard (which imports
`memory` and nothing else of ours), the demo store of `memory.testing` -- must draw the same interval
around the same numbers; `memory` is the one package all of them may import.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a success rate (0..1); (0, 1) when n is 0."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))
