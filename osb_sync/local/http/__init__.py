"""The HTTP layer both sides of the local server use, standard library only.

`httpd` (connections: timeouts, the connection cap, the Host check, dispatch), `exchange` (one
request and its answer: bodies, chunked answers, event streams, the router), `bodies` (checked
values of request bodies, timestamps). It imports neither `host/` nor `execd/`.
"""
