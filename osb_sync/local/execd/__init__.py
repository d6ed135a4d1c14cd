"""What runs inside each sandbox's container: the untrusted side of the security line.

Standard library only, and it never imports `host/` (the layering test says so): the container
loads these modules without the client or the server, on an image's python3 from 3.9 on.
Its route modules follow real execd's route groups, so the two read side by side:

- `router`: the one route table.
- `code_interpreting`: code contexts, `/code`.
- `command`: `/command`, `/session`.
- `filesystem`: the file routes.
- `uploads`: upload, replace, permissions.
- `metrics`: `/metrics`.
- `pty`: terminals, `/pty` and its WebSocket (execd's, in no released spec).
- `identity`: files as a user, `/v1/filesystem/{uid}/{gid}/...` (execd 1.1.1).

Beneath them:

- `main`: the container's main process (execd, the relay, JUPYTER_PORT; run by path).
- `template`: the execd template, which forks a root server's execds (run by path).
- `binary_child`: a real execd binary and its Jupyter server as children.
- `workers`: output tailing, bash sessions, event helpers.
- `output`: background commands' output, bounded.
- `pyworker`: the Python worker of a code context.
- `_worker`: that worker's own process (run as a script).
- `runner`: the sandbox's processes: environment, process groups, clean-up.
- `envs_file`: the `EXECD_ENVS` file every command rereads (`commands.set_env`).
"""
