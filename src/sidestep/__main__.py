"""`python -m sidestep` is the `sidestep` command."""

from __future__ import annotations

import sys

from ._ops.cli import main

sys.exit(main())
