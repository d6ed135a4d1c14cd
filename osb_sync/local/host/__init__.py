"""The local server's process on the host: the trusted side of the security line.

`server` (LocalServer: start, stop, its route table, auth, reaper), `options` (its options,
declared once; `osb-sync serve` builds its flags from them), `registry` (sandboxes, the
lifecycle routes' handlers), `validation` (422/400 rules), `proxy` (port proxy), `spares` (warm
containers), `pools` (named warm spares), `snapshots`, `diagnostics` (events and logs),
`network` (policy changes, the egress API), `container` (start, reach, pause, delete a
container), `bwrap` (what the host allows, the container's command line), `identity` (the
sandboxes' host id range), `staging` (host binds of what bwrap cannot reach by name),
`seccomp`, `cgroup`, `limits` (resource limits), `volumes`, `slirp` (outbound network),
`spawn` (the spawner thread, host process helpers), `capacity` (refusing creates before
descriptors or memory run out), `liveness` (containers that died), `recovery` (what a killed
server left), `images/` (pull, store, unpack, writable root), `execd_binary` (bring your own
execd). It never imports `execd/`: it starts `execd/main.py` as a program inside the container.
"""
