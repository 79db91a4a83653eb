"""Byte units: the constants, `"1.50 GiB"`-style formatting and `"16GiB"`-style parsing
(binary units for output; binary and decimal for input)."""

from __future__ import annotations

import re
from fractions import Fraction

from shardfeed._common import errors as _errors

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

# Unit (lower case) -> bytes; binary units are powers of 1024, decimal ones of 1000.
_UNITS = {
    "": 1,
    "b": 1,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")


def format_bytes(num_bytes: int) -> str:
    """Bytes in the largest binary unit below the number, with two decimals.

    Args:
        num_bytes: A size in bytes (>= 0).

    Returns:
        E.g. `"512 B"`, `"1.50 KiB"`, `"16.00 GiB"`; PiB is the largest unit.

    Example:
        >>> format_bytes(1536)
        '1.50 KiB'
    """
    if num_bytes < KIB:
        return f"{num_bytes} B"
    value = float(num_bytes)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= KIB
        if value < KIB or unit == "PiB":
            break
    return f"{value:.2f} {unit}"


def parse_size(text: str, name: str = "device_memory") -> int:
    """Parses a memory size: plain bytes, or a number with a unit.

    Args:
        text: E.g. `"17179869184"`, `"16GiB"`, `"1.5 TiB"` or `"80GB"`. Units
            KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB powers of
            1000 (case-insensitive); a fraction of a byte is dropped.
        name: The argument's name, for the error message.

    Returns:
        The size in bytes (>= 1).

    Raises:
        ValueError: For anything else, or a size below one byte.

    Example:
        >>> parse_size("16GiB")
        17179869184
    """
    match = _SIZE_RE.fullmatch(text)
    unit = match and _UNITS.get(match[2].lower())
    # A plain number is bytes, so it must be whole; Fraction keeps "1.1GiB" exact.
    size = 0
    if match and unit and (match[2] or "." not in match[1]):
        size = int(Fraction(match[1]) * unit)
    if size < 1:
        raise ValueError(
            _errors.message(
                "A memory size must be a positive whole number of bytes, or a number with a "
                "unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000).",
                f"{name}={text!r}",
                "Write e.g. `16GiB`, `80GB` or `17179869184`.",
            )
        )
    return size
