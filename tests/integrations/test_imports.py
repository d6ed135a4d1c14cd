"""The host integrations stay out of ``import osb_sync``."""

from __future__ import annotations

import subprocess
import sys


def test_import_osb_sync_imports_no_host_framework() -> None:
    code = (
        "import sys, osb_sync, osb_sync.integrations\n"
        "hosts = ('flask', 'django', 'deepagents', 'deepagents_code', 'osb_sync.testing')\n"
        "loaded = [name for name in hosts if name in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
