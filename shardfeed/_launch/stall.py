"""Which ranks a stuck job waits for, from where each stands (`explain`, pure).

Every shardfeed call counted in a worker's progress file is a collective, and
`fit`/`evaluate`/`predict` wait in more collectives between those calls.
So, when no rank's position moved for the whole `--progress-timeout-s`:
- counts that differ: the ranks behind are the ones the others wait for;
- counts that agree, some ranks in a callback or their own code while others
  are in shardfeed (inside a call or between its calls): the first are the
  ones the others wait for (a callback that never returns at `on_epoch_end`,
  while the others wait in the next epoch's first collective);
- every rank inside the same call: stuck inside it (a `py_function` or
  `io_callback` that never returns, a collective that never completes), or
  the call is longer than the bound;
- some inside a call, the others past it in the same API: the first.
Not a stall: every rank in its own code or callbacks (evaluating on its own,
saving), or every rank in shardfeed between its calls (opening an epoch,
exchanging rows: long work on every rank, not a wait for one).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from shardfeed._distribute.progress import IN_API, IN_CALL, IN_CALLBACK, Position

_IN_SHARDFEED = (IN_CALL, IN_API)


def _describe(position: Position, at_exit: bool) -> str:
    if position.where == IN_CALL:
        return f"inside shardfeed call {position.calls} ({position.label})"
    if position.where == IN_API:
        return f"in shardfeed's {position.label}, in a collective between its counted calls"
    if position.where == IN_CALLBACK:
        return f"in the callback hook {position.label}"
    if at_exit:
        return "at their exit, done with the script"
    return "in their own code, outside shardfeed's calls"


def _where(
    indexes: Collection[int],
    positions: Mapping[int, Position],
    exiting: Collection[int],
    names: Callable[[set[int]], str],
) -> str:
    """Where `indexes` stand: one description, or one per group of ranks."""
    groups: dict[str, set[int]] = {}
    for i in sorted(indexes):
        groups.setdefault(_describe(positions[i], i in exiting), set()).add(i)
    if len(groups) == 1:
        return next(iter(groups))
    return "in several places: " + "; ".join(
        f"rank(s) {names(ranks)} {text}" for text, ranks in groups.items()
    )


def explain(
    positions: Mapping[int, Position],
    exiting: Collection[int],
    timeout_s: float,
    names: Callable[[set[int]], str],
) -> str | None:
    """Why to stop a job whose workers stood at `positions` for `timeout_s`,
    naming the ranks the others wait for; None when that is no stall.

    Args:
        positions: Each running worker's position, by spec index.
        exiting: The indexes of workers whose exit began (their script ended).
        timeout_s: How long the positions stood still (for the message).
        names: How the message names a set of indexes (their ranks).

    Example:
        >>> explain({0: Position(4, IN_API, "fit"), 1: Position(4, IN_CALLBACK,
        ...          "on_epoch_end")}, (), 5, lambda s: ", ".join(map(str, sorted(s))))
        "worker rank(s) 1 made no progress for 5 s: they stand in the callback ..."
    """
    counts = {p.calls for p in positions.values()}
    every = set(positions)
    if len(counts) > 1:
        low, high = min(counts), max(counts)
        stuck = {i for i, p in positions.items() if p.calls == low}
        text = (
            f"they stand at shardfeed call {low} while rank(s) {names(every - stuck)} wait for "
            f"them in call {high} ({_where(stuck, positions, exiting, names)})"
        )
    else:
        busy = {i for i, p in positions.items() if p.where in _IN_SHARDFEED}
        inside = {i for i in busy if positions[i].where == IN_CALL}
        if busy and busy != every:
            stuck = every - busy
        elif inside and inside != every:
            stuck = inside
        elif inside:
            (count,) = counts
            labels = sorted({positions[i].label for i in inside})
            return (
                f"worker rank(s) {names(every)} made no progress for {timeout_s:g} s: every "
                f"one stands inside shardfeed call {count} ({', '.join(labels)}): a rank "
                "stuck inside the call (a py_function or io_callback that never returns, a "
                "collective that never completes; see each rank's stacks below), or a call "
                "that takes longer than that"
            )
        else:
            return None
        text = (
            f"they stand {_where(stuck, positions, exiting, names)} while rank(s) "
            f"{names(every - stuck)} wait for them "
            f"{_where(every - stuck, positions, exiting, names)}"
        )
    return f"worker rank(s) {names(stuck)} made no progress for {timeout_s:g} s: {text}"


def stopped_alone(
    positions: Mapping[int, Position], names: Callable[[set[int]], str]
) -> str | None:
    """Which ranks left `fit` on `model.stop_training` while others trained
    on (`Position.stopped_at` differs): the others then wait in, or fail in,
    collectives those ranks never join, and the first rank to fail is often
    one that trained on. None when every rank stopped alike, or none did.

    Example:
        >>> stopped_alone({0: Position(5, stopped_at=4), 1: Position(5)}, names)
        "rank(s) 0 stopped training at shardfeed call 4 (a callback set ..."
    """
    stops = {i: p.stopped_at for i, p in positions.items()}
    if len(set(stops.values())) < 2:
        return None
    first = min(v for v in stops.values() if v)
    stopped = {i for i, v in stops.items() if v == first}
    return (
        f"rank(s) {names(stopped)} stopped training at shardfeed call {first} (a callback set "
        f"`model.stop_training` there) while rank(s) {names(set(stops) - stopped)} trained on, "
        "so the ranks ran different collectives. Set `model.stop_training` alike on every "
        "rank: decide from the logs, which every rank shares, in a callback that runs on "
        "every rank."
    )
