"""Prints where CI's time went: each tier's seconds and the slowest test files.

Reads the JUnit XML files `.ci/test` has each pytest run write (one per tier,
named after it) and prints one line per tier, then the slowest files across
all tiers, so a CI log says what to trim when CI runs long.
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(folder: Path, top: int = 15) -> None:
    files: collections.Counter[str] = collections.Counter()
    print("CI time by tier (pytest's seconds; the two lanes run at once):")
    for path in sorted(folder.glob("*.xml")):
        tier_s = 0.0
        for case in ET.parse(path).iter("testcase"):
            seconds = float(case.get("time") or 0.0)
            tier_s += seconds
            parts = (case.get("classname") or "").split(".")
            module = next((p for p in parts if p.startswith("test_")), parts[-1])
            files[f"{path.stem}: {module}"] += seconds
        print(f"  {path.stem:<12} {tier_s:8.0f} s")
    print(f"The {top} slowest test files:")
    for name, seconds in files.most_common(top):
        print(f"  {seconds:8.0f} s  {name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
