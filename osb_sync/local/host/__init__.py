"""The local server's process on the host: the trusted side of the security line.

It never imports `execd/`: it starts `execd/main.py` as a program inside the container.

The server and its resources, each module a resource's routes beside its store:

- `server`: LocalServer (start, stop, its one route table, auth, the reaper), and the one
  place where the mechanics' errors become HTTP answers.
- `options`: its options, declared once (`osb-sync serve` builds its flags from them).
- `registry`: the resources composed, and the create (planned whole, then carried out).
- `sandboxes`: the sandboxes' table and their lifecycle routes.
- `journal`: each sandbox's events, which every resource writes.
- `snapshots`: snapshots' routes and store.
- `diagnostics`: the diagnostics routes (the journal is their store).
- `pools`: named pools' routes and store.
- `network`: what a network policy asks for, and the routes that change it.
- `validation`: the lifecycle API's request checks (FastAPI's 422s, the 400s).
- `proxy`: the proxy to ports inside a sandbox.
- `errors`: what the mechanics below refuse, before any HTTP answer.

Its containers:

- `container`: start, reach, pause and delete one container.
- `rootview`: what differs between a sandbox on the host's view and one on an image's root.
- `spares`: warm containers, and where a create's container comes from.
- `execd_template`: the execd template that forks a root server's execds.
- `package`: the process's private copy of the package its sandboxes run (a reinstall
  leaves it alone).
- `entrypoint`: what a sandbox runs as its entrypoint.
- `execd_binary`: bring your own execd.
- `liveness`: why a container ended.
- `logs`: the containers' logs, bounded.
- `recovery`: what a killed server left, reaped at start.
- `capacity`: refusing creates before descriptors or memory run out.
- `images/`: images: pull, store, unpack, a sandbox's root over one.

Their confinement and limits:

- `bwrap`: what isolation the host allows, and bubblewrap's command line.
- `identity`: the sandboxes' host id range.
- `staging`: host binds of what bwrap cannot reach by name.
- `seccomp`: the sandboxes' seccomp filter.
- `firewall`: nftables in a sandbox's namespace, keeping it from this host.
- `egress`: egress rules by name: a sandbox's resolver and the addresses it handed out.
- `slirp`: outbound network through slirp4netns.
- `outbound`: a sandbox's way out: slirp4netns, its firewall tables and resolver.
- `volumes`: a create's volumes, checked, opened and bound by descriptor.
- `limits`: resource limits, and how each is enforced.
- `cgroup`: the sandboxes' cgroups (v1, and the `--cgroup-parent` place).
- `cgroup2`: the sandboxes' cgroups on a v2 host, in a delegated subtree (not run on one yet).
- `disk`: each sandbox's disk, one size- and inode-limited tmpfs.
- `spawn`: the spawner thread, and host process helpers.
"""
