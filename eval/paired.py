"""Paired difference of two methods over the questions both answered, with a bootstrap standard error.

Scored the way the report scores (mean per dataset, datasets averaged into their group, groups averaged into the
macro). The bootstrap resamples questions within each dataset, so a group's weight stays what the report gives it.
A scoreboard of 15-30 questions a dataset moves by several points between runs that differ only in float precision:
read a difference against its standard error. Used by the report (each method against `plot_method`) and by
`scripts/paired_bootstrap.py` (any two methods of an output folder).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping

Scores = Mapping[tuple[str, str], float]  # (dataset, question id) -> score


def _macro(qids_by_dataset: Mapping[str, list[str]], diff: Mapping[tuple[str, str], float], group_of) -> float:
    per_group: dict[str, list[float]] = {}
    for ds, qids in qids_by_dataset.items():
        per_group.setdefault(group_of[ds], []).append(sum(diff[(ds, q)] for q in qids) / len(qids))
    return statistics.fmean(statistics.fmean(v) for v in per_group.values())


def paired_difference(
    a: Scores, b: Scores, group_of: Mapping[str, str], resamples: int = 2000, seed: int = 0
) -> dict[str, float] | None:
    """Macro of `a - b` over their common questions in datasets of `group_of`: {diff, se, n}; None if none."""
    diff = {key: x - b[key] for key, x in a.items() if key in b and key[0] in group_of}
    if not diff:
        return None
    by_ds: dict[str, list[str]] = {}
    for ds, qid in sorted(diff):
        by_ds.setdefault(ds, []).append(qid)
    rng = random.Random(seed)
    boot = [
        _macro({ds: rng.choices(q, k=len(q)) for ds, q in by_ds.items()}, diff, group_of) for _ in range(resamples)
    ]
    return {"diff": _macro(by_ds, diff, group_of), "se": statistics.pstdev(boot), "n": len(diff)}
