"""Error text in one shape: the constraint, then `Received: ...`, then the fix.

Every user-facing error in shardfeed is built here so tests can pin the text
and the three parts never drift apart.
"""

from __future__ import annotations


def message(constraint: str, received: str, fix: str) -> str:
    """Joins the three parts of an error message.

    Args:
        constraint: What was expected, as a sentence.
        received: What was given, already formatted as `name=value`.
        fix: What the user should do instead.

    Returns:
        `"<constraint> Received: <received>. <fix>"`.
    """
    return f"{constraint} Received: {received}. {fix}"
