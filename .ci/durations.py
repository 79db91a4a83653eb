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


def main(folder: Path, setup_s: str | None = None, horovod: str = "", top: int = 7) -> None:
    files: collections.Counter[str] = collections.Counter()
    tiers: dict[str, float] = {}
    for path in sorted(folder.glob("*.xml")):
        tiers[path.stem] = 0.0
        for case in ET.parse(path).iter("testcase"):
            seconds = float(case.get("time") or 0.0)
            tiers[path.stem] += seconds
            parts = (case.get("classname") or "").split(".")
            module = next((p for p in parts if p.startswith("test_")), parts[-1])
            if module:  # a module skipped whole is a case without a class name
                files[f"{path.stem}: {module}"] += seconds
    # The tiers last: fresh-ci and CI summaries show a log's last lines.
    print(f"The {top} slowest test files:")
    for name, seconds in files.most_common(top):
        print(f"  {seconds:8.0f} s  {name}")
    print("CI time by tier (pytest's seconds; the two lanes run at once):")
    if setup_s:
        print(f"  {'setup':<12} {float(setup_s):8.0f} s  (before both lanes)")
    if horovod.strip():
        ready_s, built = horovod.split()
        print(
            f"  {'horovod venv':<12} {float(ready_s):8.0f} s  (beside the lanes from the "
            f"start; wheel built: {built})"
        )
    for lane, names in LANES.items():
        parts = "  ".join(f"{n} {tiers[n]:.0f} s" for n in names if n in tiers)
        total = sum(tiers.get(n, 0.0) for n in names)
        print(f"  {lane:<12} {total:8.0f} s  ({parts})")


# Which pytest runs share a lane (`.ci/test`): they run one after another.
LANES = {
    "lane 1": ("main", "keras", "keras-resident"),
    "lane 2": ("jax-pinned", "jax-newest", "horovod", "beside"),
}


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:4])
