"""Images for local sandboxes: pulled with skopeo, unpacked once into a store, run by bwrap.

- `pull`: an image URI to a source (a registry, `oci:DIR:TAG`, `docker-archive:FILE`) and
  `skopeo copy` of it, for one platform, into a `dir:` layout (manifest bytes kept as the
  registry serves them, so the digest is the registry's), with the operator's credentials
  and configuration kept out (see its docstring); skopeo's failures become `PullError`s.
- `unpack`: the layers into a root directory, every blob's digest checked, whiteouts and
  opaque directories honoured, anything that would land outside refused.
- `config`: the image config's Env, WorkingDir, User, Entrypoint/Cmd and its python3.
- `inside`: the store's unpacks, copies and removals for a server that is not root but has an
  id range, in a user namespace of that range (the image's ids are the range's).
- `store`: the content-addressed store (one image per manifest digest, locked, LRU cap).
- `rootfs`: a sandbox's root over an image (`ImageView`): its writable layer and bwrap view.
- `service`: what a create's image becomes (the host's view, or a stored image and how to run
  it).
- `execd_image`: an execd binary taken from an image (`execd_image=`).
"""
