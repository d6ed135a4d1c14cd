"""A local OpenSandbox-compatible development server, standard library only.

`LocalServer` speaks the lifecycle API of the OpenSandbox server and emulates each sandbox's
execd (code contexts, commands, bash sessions, files, metrics) plus the server proxy to ports
inside a sandbox, all on one port::

    with LocalServer() as srv:
        print(srv.api_base)  # http://127.0.0.1:<port>/v1

It is meant for development and tests, and it is NOT a security boundary. A "sandbox" is a
directory plus processes running as the server's user on the host: they see the host's file
system (absolute paths are used as they are), its users and, unless a deny-all network policy
puts them in a private network namespace, its network. Images and entrypoints are recorded but
not run; Python code runs with the server's interpreter. The server binds 127.0.0.1 by default;
execd routes need the per-sandbox token returned by the endpoint route, and lifecycle routes the
API key when one is set. Do not expose it to other users or networks.

Modules: `server` (LocalServer: start, stop, routing, auth, reaper), `httpd` (connections:
timeouts, cap, Host check, dispatch), `registry` (sandboxes, lifecycle routes), `validation`
(422/400 rules), `execd` (execd routing, code contexts, /code), `bodies` (checked execd request
values), `commands` (/command, /session), `files` (file routes, metrics), `filewrite` (uploads,
replace, permissions), `workers` (Python workers, output tailing, bash sessions), `runner`
(process groups, network namespaces), `proxy` (port proxy), `_http` (request bodies, chunked
answers, event streams, routing), `_worker` and `_nsagent` (helper programs run as scripts).
"""

from .server import LocalServer

__all__ = ["LocalServer"]
