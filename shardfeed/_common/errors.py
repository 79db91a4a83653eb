"""Error text in one shape: the constraint, then `Received: ...`, then the fix.

`message` builds every user-facing error so tests can pin the text; `require`
raises one when a check fails; `is_integer` is the test every count argument
shares, `is_switch` every True/False/"auto" one.
"""

from __future__ import annotations

import numbers


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


def require(ok: bool, constraint: str, received: str, fix: str) -> None:
    """Raises `ValueError(message(constraint, received, fix))` unless `ok`:
    the check every option dataclass runs on each field."""
    if not ok:
        raise ValueError(message(constraint, received, fix))


def is_integer(value: object) -> bool:
    """Whether `value` is an integer: any `numbers.Integral` (Python `int`,
    `np.int64`, ...) except `bool`, which is an `int` but never a count.

    Args:
        value: The argument to test.

    Returns:
        True for integers of any integral type, False otherwise.

    Example:
        >>> is_integer(np.int64(3)), is_integer(True), is_integer(3.0)
        (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_switch(value: object) -> bool:
    """Whether `value` is True, False or "auto": a `bool`, not a number
    equal to one (`1 in (True, False, "auto")` is true, and `streaming=1`
    was accepted, then read as not `True`).

    Example:
        >>> is_switch(True), is_switch("auto"), is_switch(1), is_switch(0.0)
        (True, True, False, False)
    """
    return isinstance(value, bool) or (isinstance(value, str) and value == "auto")
