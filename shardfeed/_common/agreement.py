"""Ranks agree on a call's settings: one all-gather, one refusal on every rank.

Owns `check_settings` and `plain` (the JSON form compared), for any world with
`world_size` and `all_gather_bytes`. Why: ranks given different step counts or
collectives do not fail alone, they hang in a collective the others never
join; so each call's deciding arguments are compared first.
"""

from __future__ import annotations

import json
import numbers
from typing import Any

from shardfeed._common import errors as _errors
from shardfeed._common.world import WorldLike

_CALL_FIX = (
    "Pass the same arguments on every worker (read them from one config; a "
    "value that depends on the rank, the host or the clock gives each rank "
    "other steps): a rank that runs other steps or collectives than the others "
    "hangs or crashes the job."
)


def check_settings(world: WorldLike, call: str, settings: dict[str, Any]) -> None:
    """Raises on every worker when the workers called `call` with other settings.

    A collective (one all-gather of `settings` as JSON): call it on every
    worker at the same point, before the call's first other collective.

    Args:
        world: The workers.
        call: The public call, as the message names it (e.g. `"fit"`).
        settings: This worker's settings: names to JSON values (`plain`), in
            the order a difference is looked for.

    Raises:
        ValueError: Naming the first setting that differs and each rank's
            value where it differs from rank 0's.
    """
    if world.world_size == 1:
        return
    gathered = world.all_gather_bytes(json.dumps(settings).encode())
    difference = settings_difference(call, [json.loads(p) for p in gathered])
    if difference is not None:
        raise ValueError(
            _errors.message(
                f"Every worker must call `{call}` with the same arguments: they decide "
                "how many steps and collectives each rank runs.",
                difference,
                _CALL_FIX,
            )
        )


def settings_difference(call: str, settings: list[dict[str, Any]]) -> str | None:
    """The first setting the ranks disagree on, with rank 0's value and each
    differing rank's (at most 6 of them), or None when all agree."""
    names = list(dict.fromkeys(name for mine in settings for name in mine))
    for name in names:
        values = [mine.get(name) for mine in settings]
        differ = [rank for rank, value in enumerate(values) if value != values[0]]
        if differ:
            shown = [f"rank 0 has {_shown(values[0])}"]
            shown += [f"rank {rank} has {_shown(values[rank])}" for rank in differ[:6]]
            more = f" (and {len(differ) - 6} more ranks)" if len(differ) > 6 else ""
            return f"ranks disagree on {call}'s `{name}`: {', '.join(shown)}{more}"
    return None


def _shown(value: Any) -> str:
    # Python's spelling (None, True, 'local'), not JSON's.
    return repr(value) if not isinstance(value, list | dict) else json.dumps(value)


def plain(value: Any) -> Any:
    """A JSON value for comparing across ranks: numbers, strings, bools and
    None as they are, lists and mappings of them element-wise (keys as
    strings, sorted), anything else by its type's name (a rank-local object's
    `repr` would differ by its address)."""
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return _plain(value)


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return type(value).__name__
