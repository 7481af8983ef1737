"""Shuffled and subsetted KB lists for plan records: routing must read the list, not memorise one layout.

Synthesis renders every plan prompt with the same KB set in the same order. A router trained only on that layout
routes by position and by its prior: the shipped stop-11 router sent all 7 demo questions (a two-KB list it never
saw) to the Table Retriever. Here a share of the plan records is re-rendered (through `agent.protocol`, the one owner
of the prompt text) with a random subset of the KBs in a random order. The gold KB is always kept, so the target
stays right; a stop step (gold KB None) may get any subset.
"""

from __future__ import annotations

import dataclasses
import random

from agent.protocol import plan_kb_list, with_kb_list
from agent.step_records import PLAN, StepRecord


def vary_kb_lists(records: list[StepRecord], share: float, min_kbs: int = 2, seed: int = 0) -> list[StepRecord]:
    """Re-render `share` of the plan records with a shuffled subset (at least `min_kbs`) of their KB list.

    Records keep their position; `kb_names` follows the new list. Answer and final records are untouched.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"`kb_list_share` must be in [0, 1], got {share!r}")
    if min_kbs < 1:
        raise ValueError(f"`kb_list_min` must be >= 1, got {min_kbs!r}")
    rng = random.Random(seed)
    out = []
    for r in records:
        if r.step_type != PLAN or rng.random() >= share:
            out.append(r)
            continue
        kbs = plan_kb_list(r.messages)
        gold = [kb for kb in kbs if kb[0] == r.gold.get("kb")]
        others = [kb for kb in kbs if kb[0] != r.gold.get("kb")]
        size = rng.randint(min(min_kbs, len(kbs)), len(kbs))
        chosen = gold + rng.sample(others, size - len(gold))
        rng.shuffle(chosen)
        out.append(dataclasses.replace(r, messages=with_kb_list(r.messages, chosen),
                                       kb_names=tuple(name for name, _ in chosen)))  # fmt: skip
    return out
