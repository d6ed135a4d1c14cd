"""Images for local sandboxes: pulled with skopeo, unpacked once into a store, run by bwrap.

- `pull.py`: an image URI to a source (a registry, `oci:DIR:TAG`, `docker-archive:FILE`) and
  `skopeo copy` of it, for one platform, into a `dir:` layout (manifest bytes kept as the
  registry serves them, so the digest is the registry's), with the operator's credentials
  and configuration kept out (see its docstring); skopeo's failures become `PullError`s.
- `unpack.py`: the layers into a root directory, every blob's digest checked, whiteouts and
  opaque directories honoured, anything that would land outside refused.
- `config.py`: the image config's Env, WorkingDir, User, Entrypoint/Cmd and its python3.
- `store.py`: the content-addressed store (one image per manifest digest, locked, LRU cap).
- `rootfs.py`: each sandbox's writable layer over the shared image and its bwrap view.
"""
