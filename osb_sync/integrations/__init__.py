"""Host-framework integrations, each imported only by its host (nothing is imported here).

- ``osb_sync.integrations.flask``: ``OpenSandbox(app)``, a per-request pooled sandbox.
- ``osb_sync.integrations.django``: ``OPENSANDBOX`` settings, ``pooled_sandbox(request)``.
- ``osb_sync.integrations.deepagents``: the ``deepagents_code.sandbox_providers`` entry point.

The pytest plugin is ``osb_sync.testing``.
"""
