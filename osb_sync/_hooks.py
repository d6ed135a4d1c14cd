"""The process hooks the client sets: at exit, and in the child after a fork.

Every module registers through here, so that the one platform difference is handled once:
``os.register_at_fork`` exists on Unix only, and where it is missing (Windows) there is no
``fork`` either, so there is no child to prepare and the hook is not needed.
"""

from __future__ import annotations

import atexit
import os
from typing import Callable


def at_exit(callback: Callable[[], object]) -> None:
    """Call ``callback()`` when the interpreter exits (as :func:`atexit.register`)."""
    atexit.register(callback)


def in_forked_child(callback: Callable[[], object]) -> None:
    """Call ``callback()`` in the child after every ``os.fork()``; nothing where there is none.

    The child has only the thread that forked: a hook forgets what the parent's threads own.
    """
    register = getattr(os, "register_at_fork", None)
    if register is not None:
        register(after_in_child=callback)
