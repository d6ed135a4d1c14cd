"""``python -m osb_sync``: the same as the ``osb-sync`` command."""

import sys

from .cli import main

sys.exit(main())
