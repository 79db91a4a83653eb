"""Start N workers of a script or function: `shardfeed.launch.run`, twin of `shardfeed launch`.

Example:
    >>> from shardfeed import launch
    >>> launch.run("examples/train.py", num_workers=2)
    0
"""

from shardfeed._launch import LaunchOptions as LaunchOptions
from shardfeed._launch import run as run

__all__ = ["LaunchOptions", "run"]
