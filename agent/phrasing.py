"""How dataset rows are worded as questions, in one place, so synthesis (training) and eval ask the same thing."""

from __future__ import annotations


def tabfact_question(statement: str) -> str:
    """A TabFact claim asked as a yes/no question (gold: `yes` when entailed, `no` when refuted).

    Example:
        >>> tabfact_question("the team score 3 goal ")
        'Is it true that the team score 3 goal?'
    """
    return f"Is it true that {statement.strip()}?"
