"""Defaults shared by the whole client, in one place."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

VERSION = "0.2.0"

#: The default ``max_output_bytes``: a run's output as read (UTF-8 bytes of stdout, stderr and
#: result payloads; not the event stream's framing).
MAX_OUTPUT_BYTES = 10 * 1024 * 1024
# Bytes read from (or, for uploads, sent to) a socket at a time.
CHUNK_SIZE = 64 * 1024
DEFAULT_TEMPLATE = "opensandbox/code-interpreter:v1.1.0"
DEFAULT_ENTRYPOINT = ("/opt/code-interpreter/code-interpreter.sh",)
DEFAULT_TIMEOUT = 300
# Read-only so that no caller can change the default for everybody; each create sends a copy.
DEFAULT_RESOURCE_LIMITS: Mapping[str, str] = MappingProxyType({"cpu": "1", "memory": "2Gi"})
EXECD_PORT = 44772
# One past the largest uid or gid of files as a user (4294967295 is reserved; execd 1.1.1).
MAX_ID = 4294967295
DEFAULT_POLL_INTERVAL = 0.2
DEFAULT_READY_TIMEOUT = 30.0
DEFAULT_LANGUAGE = "python"
# After an interrupt, how long the client waits (seconds) for the run to end on execd.
INTERRUPT_WAIT = 5.0
# The languages execd knows (runtime/language.go); which run depends on the image.
LANGUAGES = ("python", "bash", "java", "javascript", "typescript", "go", "sql")

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
API_BASE_ENV = "OPEN_SANDBOX_API_BASE"
API_KEY_ENV = "OPEN_SANDBOX_API_KEY"
DOMAIN_ENV = "OPEN_SANDBOX_DOMAIN"
REQUEST_ID_HEADER = "X-Request-ID"
# Metadata key that tags every create, so a sandbox whose create response was lost can be found.
CREATE_ID_KEY = "osb-sync/create-id"


class NoTimeout:
    """Type of NO_TIMEOUT."""

    def __repr__(self) -> str:
        return "NO_TIMEOUT"


# ``create_sandbox(timeout=NO_TIMEOUT)`` sends ``null``: the sandbox never expires.
NO_TIMEOUT = NoTimeout()
