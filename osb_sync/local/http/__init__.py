"""The HTTP layer both sides of the local server use, standard library only.

It imports neither `host/` nor `execd/`:

- `httpd`: connections: timeouts, the connection cap, the Host check, dispatch.
- `head`: a request head on the wire, read under a cap and parsed.
- `exchange`: one request and its answer: bodies, chunked answers, event streams, the router.
- `bodies`: checked values of request bodies, timestamps.
"""
