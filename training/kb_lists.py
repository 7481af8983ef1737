"""Shuffled, subsetted and renamed KB lists for plan records: routing must read the list, not memorise one layout
or a handful of names.

Synthesis renders every plan prompt with the same KB set in the same order. A router trained only on that layout
routes by position and by its prior: the shipped stop-11 router sent all 7 demo questions (a two-KB list it never
saw) to the Table Retriever. Here a share of the plan records is re-rendered (through `agent.protocol`, the one owner
of the prompt text) with a random subset of the KBs in a random order. The gold KB is always kept, so the target
stays right; a stop step (gold KB None) may get any subset.

Names are the other half. A router trained under five fixed names routes by the name: under names a user might give
(docs/stop40/: "Encyclopedia Passages", "Film Archive", ...) the shipped router sent 2 % of its text searches to the
text KB. `vary_kb_names` re-renders a share of the plan records with each KB under another name, an alias from the
recipe or an opaque one ("Collection 4"), its description kept, so the description is what tells the KBs apart.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from agent.protocol import check_display_name, plan_kb_list, with_kb_list
from agent.step_records import PLAN, StepRecord


def vary_kb_lists(records: list[StepRecord], share: float, min_kbs: int = 2, seed: int = 0) -> list[StepRecord]:
    """Re-render `share` of the plan records with a shuffled subset (at least `min_kbs`) of their KB list.

    Records keep their position; `kb_names` follows the new list. Answer and final records are untouched.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"`kb_list_share` must be in [0, 1], got {share!r}")
    if min_kbs < 1:
        raise ValueError(f"`kb_list_min` must be >= 1, got {min_kbs!r}")

    def subset(r: StepRecord, rng: random.Random) -> StepRecord:
        kbs = plan_kb_list(r.messages)
        gold = [kb for kb in kbs if kb[0] == r.gold.get("kb")]
        others = [kb for kb in kbs if kb[0] != r.gold.get("kb")]
        size = rng.randint(min(min_kbs, len(kbs)), len(kbs))
        chosen = gold + rng.sample(others, size - len(gold))
        rng.shuffle(chosen)
        return dataclasses.replace(r, messages=with_kb_list(r.messages, chosen),
                                   kb_names=tuple(name for name, _ in chosen))  # fmt: skip

    return _redo_plans(records, share, seed, subset)


def _redo_plans(records: list[StepRecord], share: float, seed: int, redo) -> list[StepRecord]:  # noqa: ANN001
    """`redo(record, rng)` on a seeded `share` of the plan records, the rest (and every other step type) as they are."""
    rng = random.Random(seed)
    return [redo(r, rng) if r.step_type == PLAN and rng.random() < share else r for r in records]


OPAQUE_NAMES = ("Collection {}", "Index {}", "KB {}", "Store {}", "Database {}")


def check_kb_aliases(aliases: dict) -> None:
    """Raise, naming the alias, when one could not be a display name (the step grammar must write it in `<ret>`, and
    the prompt's KB list splits a line at its first ': ')."""
    for name, names in aliases.items():
        if not isinstance(names, list) or not names:
            raise ValueError(f"`kb_name_aliases.{name}` must be a non-empty list of names, got {names!r}")
        for alias in names:
            check_display_name(alias, where=f"`kb_name_aliases.{name}`")
            if ": " in alias:
                raise ValueError(f"`kb_name_aliases.{name}`: {alias!r} may not hold ': ' (it ends a KB's name)")


def vary_kb_names(
    records: list[StepRecord], share: float, aliases: dict[str, list[str]], opaque: float = 0.3, seed: int = 0
) -> list[StepRecord]:
    """Re-render `share` of the plan records with their KBs renamed, descriptions kept.

    In a renamed record each KB gets, independently, an opaque name (with probability `opaque`), else one of
    `aliases[its name]`, else keeps its name; no two KBs of a list share one. The gold KB and `kb_names` follow the new
    names. Answer and final records are untouched (their prompts name no KB).
    """
    if not 0.0 <= share <= 1.0 or not 0.0 <= opaque <= 1.0:
        raise ValueError(f"`kb_name_share` and `kb_name_opaque` must be in [0, 1], got {share!r} and {opaque!r}")
    check_kb_aliases(aliases)

    def rename(r: StepRecord, rng: random.Random) -> StepRecord:
        kbs = plan_kb_list(r.messages)
        taken = {name for name, _ in kbs}
        renamed: dict[str, str] = {}
        for name, _ in kbs:
            if rng.random() < opaque:
                options = [t.format(n) for t in OPAQUE_NAMES for n in range(1, 10)]
            else:
                options = aliases.get(name, [])
            options = [o for o in options if o not in taken or o == name]
            renamed[name] = rng.choice(options) if options else name
            taken.add(renamed[name])
        return renamed_kbs(r, renamed)

    return _redo_plans(records, share, seed, rename)


def kb_renames(shown_in: str | Path, renamed_in: str | Path) -> dict[str, str]:
    """{display name in `shown_in`: display name in `renamed_in`} for the KBs (matched by `name`) both files hold: what
    `renamed_kbs` takes to list records rendered from one KB file under another's names."""
    from agent.kbs import kb_configs

    shown = {c.name: c.display_name for c in kb_configs(shown_in)}
    names = {shown[c.name]: c.display_name for c in kb_configs(renamed_in) if c.name in shown}
    if not names:
        raise ValueError(f"{renamed_in} holds none of the KBs of {shown_in} (KBs are matched by `name`)")
    return names


def renamed_kbs(record: StepRecord, names: dict[str, str]) -> StepRecord:
    """A plan record with its KBs listed under `names[old name]` (a KB not in `names` keeps its own), descriptions
    kept; its gold KB and `kb_names` follow."""
    kbs = plan_kb_list(record.messages)
    gold = record.gold.get("kb")
    return dataclasses.replace(
        record,
        messages=with_kb_list(record.messages, [(names.get(name, name), desc) for name, desc in kbs]),
        kb_names=tuple(names.get(name, name) for name, _ in kbs),
        gold={**record.gold, "kb": names.get(gold, gold)} if isinstance(gold, str) else record.gold,
    )
