"""What runs inside each sandbox's container: the untrusted side of the security line.

Standard library only, and it never imports `host/` (the layering test says so): the container
loads these modules without the client or the server. Files follow real execd's route groups,
so the two read side by side: `router` (the one route table), `code_interpreting` (code
contexts, `/code`), `command` (`/command`, `/session`), `filesystem` (file routes), `uploads`
(upload, replace, permissions), `metrics`. Beneath them: `main` (the container's entry point:
execd, relay, JUPYTER_PORT; run by path), `binary_child` (a real execd binary and its Jupyter
server as children), `workers` (output tailing, bash sessions, event helpers), `pyworker` and
`_worker` (the Python worker of a code context; `_worker.py` runs as a script), `runner`
(process groups, paths).
"""
