"""``python -m osb_sync``: the same as the ``osb-sync`` command."""

import sys

from ._cli import main

sys.exit(main())
