"""``python -m bertblocks.cli``: the same as the ``bertblocks`` command."""

from __future__ import annotations

import sys

from . import main

sys.exit(main())
