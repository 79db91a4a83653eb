"""`python -m shardfeed ...`: the `shardfeed` command, for a checkout on `PYTHONPATH`
with no console script installed (e.g. `.ci/gpu-check.sh` on a lent machine)."""

import sys

from shardfeed._commands.cli import main

sys.exit(main())
