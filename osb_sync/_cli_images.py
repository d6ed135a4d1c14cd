"""The local image store's commands: ``osb-sync images``, ``images prune`` and ``pull``.

They act on the store directly, as a local server does (`local/host/images/store.py`, its
directory `--image-store`, default `$XDG_CACHE_HOME/osb-sync/images`), under the store's own
locks, so they run beside servers that use it: ``prune`` leaves the images a sandbox runs, and a
``pull`` and a server's create of one image pull it once. No server is needed, nor any API key.

``pull`` unpacks with the owners a server on this host would give (the sandboxes' id range,
where sandboxes are isolated), so a server's sandboxes run what it pulled. Its progress is a
bar on a terminal (standard error), else one plain line per phase. What it says of the
image (stdout) notes the device nodes its layers had and the store skipped (each sandbox gets
its own /dev); ``images --json`` lists them (`skipped`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ._cli_options import GlobalOptions, ImagesOptions, PullOptions, StoreOptions, UsageError
from ._cli_output import print_table
from ._cli_registry_auth import with_usual_credentials

BAR_WIDTH = 30
LINE_EVERY = 5.0  # seconds between two plain progress lines


class ImageCommandError(UsageError):
    """An image command failed; the message says what to fix."""


def _size_text(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _store(options: StoreOptions, for_pull: bool = False) -> Any:
    """The image store the flags name (its directory made if missing)."""
    from .local.host.images import inside, pull, store, unpack

    given = options.keywords
    root = Path(given["image_store"]) if given.get("image_store") else store.default_root()
    owner: unpack.OwnerMap = unpack.server_owned
    work: inside.RangeWork | None = None
    if for_pull:
        from .local.host import bwrap

        support = bwrap.probe()
        if support.bwrap is not None:
            owner, work = inside.for_ids(support.ids)
    else:  # what a pull in its range unpacked, prune removes there
        work = inside.of_host()
    auth_file = given.get("registry_auth_file")
    puller = pull.Puller(
        root / "scratch",
        tuple(given.get("insecure_registries") or ()),
        Path(auth_file) if auth_file else None,
        tuple(Path(p).resolve() for p in given.get("local_image_paths") or ()),
    )
    try:
        return store.ImageStore(
            root, puller, given["image_store_size"], owner, given.get("image_size_limit"), work
        )
    except OSError as exc:
        raise ImageCommandError(
            f"cannot open the image store {root}: {exc.strerror or exc}; pass another"
            " directory with --image-store DIR"
        ) from None


def cmd_images(cli: GlobalOptions, images: ImagesOptions) -> int:
    """``osb-sync images``: the store's images (reference, digest, size, last used);
    ``images prune``: remove those no sandbox runs."""
    from .local.host.images.store import describe_age

    image_store = _store(images.store)
    if images.images_action == "prune":
        gone = image_store.prune()
        if cli.json:
            print(json.dumps({"removed": gone}))
        else:
            for digest in gone:
                print(f"removed {digest}")
            print(f"{len(gone)} image{'s' if len(gone) != 1 else ''} removed", file=sys.stderr)
        return 0
    found = image_store.images()
    if cli.json:
        print(json.dumps(found))
        return 0
    rows = [
        {
            "reference": ", ".join(sorted({r.split("|", 1)[0] for r in i["references"]})) or "-",
            "digest": i["digest"][:19],
            "size": _size_text(i["size"]),
            "last used": describe_age(i["last_used"]) + (" (in use)" if i["in_use"] else ""),
        }
        for i in sorted(found, key=lambda i: -i["last_used"])
    ]
    print_table(rows, ["reference", "digest", "size", "last used"])
    return 0


class PullProgress:
    """Renders a pull's progress (`pull.Progress`): a bar on a terminal, else plain lines."""

    def __init__(self, reference: str, stream: TextIO, terminal: bool) -> None:
        self.reference = reference
        self.stream = stream
        self.terminal = terminal
        self.phase = ""
        self.last_line = 0.0
        self.last: tuple[int, int | None] | None = None  # a download report not printed

    def __call__(self, phase: str, done: int, total: int | None) -> None:
        """One report: the phase ("download", "unpack"), bytes so far, total bytes or None."""
        if total:
            done = min(done, total)  # the layout's own files (manifest, config) are not counted
        if self.terminal:
            if phase == "download" and total:
                filled = min(BAR_WIDTH, BAR_WIDTH * done // total)
                bar = "#" * filled + "-" * (BAR_WIDTH - filled)
                text = f"[{bar}] {_size_text(done)} of {_size_text(total)}"
            elif phase == "download":
                text = f"{_size_text(done)} downloaded"
            else:
                text = "unpacking"
            self.stream.write(f"\r\033[K{self.reference}: {text}")
        else:
            now = time.monotonic()
            if phase == self.phase and now - self.last_line < LINE_EVERY:
                self.last = (done, total)
                return
            if self.phase == "download" and phase != "download" and self.last is not None:
                got, whole = self.last
                of_whole = f" of {_size_text(whole)}" if whole else ""
                self.stream.write(f"{self.reference}: downloaded {_size_text(got)}{of_whole}\n")
            self.last_line, self.last = now, None
            if phase == "download":
                of = f" of {_size_text(total)}" if total else ""
                self.stream.write(f"{self.reference}: downloading, {_size_text(done)}{of}\n")
            else:
                self.stream.write(f"{self.reference}: unpacking\n")
        self.phase = phase
        self.stream.flush()

    def end(self) -> None:
        """Clear a terminal's bar."""
        if self.terminal and self.phase:
            self.stream.write("\r\033[K")
            self.stream.flush()


def cmd_pull(cli: GlobalOptions, wanted: PullOptions) -> int:
    """``osb-sync pull IMAGE``: fetch it into the store now (asking its registry again)."""

    with with_usual_credentials(wanted.store.keywords) as keywords:
        return _pull(cli, wanted, StoreOptions(keywords))


def _pull(cli: GlobalOptions, wanted: PullOptions, store_options: StoreOptions) -> int:
    from .local.host.images import pull
    from .local.host.images.store import skipped_note

    image_store = _store(store_options, for_pull=True)
    platform = pull.host_platform()
    if wanted.platform:
        os_name, _, arch = wanted.platform.partition("/")
        if not os_name or not arch:
            raise UsageError(f"--platform takes OS/ARCH (linux/amd64), not {wanted.platform!r}")
        platform = {"os": os_name, "arch": arch}
    shown = PullProgress(wanted.image, sys.stderr, sys.stderr.isatty() and not cli.json)
    started = time.monotonic()
    try:
        image, _ = image_store.get(wanted.image, platform, None, refresh=True, progress=shown)
    except pull.PullError as exc:
        reason = f"{exc.reason}: cannot pull {wanted.image}: {_fix(exc)}"
        raise ImageCommandError(reason) from None
    finally:
        shown.end()
    seconds = time.monotonic() - started
    if cli.json:
        found = {"reference": image.reference, "digest": image.digest, "size": image.size}
        found.update(python=image.python, skipped=list(image.skipped))
        print(json.dumps({**found, "seconds": round(seconds, 3)}))
    else:
        notes = [] if image.python else ["no python3: sandboxes need the server's execd binary"]
        if image.skipped:
            notes.append(f"{skipped_note(image.skipped)}: each sandbox gets its own /dev")
        note = f" ({'; '.join(notes)})" if notes else ""
        print(f"{image.pinned} {_size_text(image.size)} in {seconds:.1f}s{note}")
    return 0


def _fix(exc: Any) -> str:
    """The pull error's message, with the flag that fixes it where one does."""
    from .local.host.images import pull

    message = str(exc.message)
    hints = {
        pull.UNAUTHORIZED: "give credentials with --registry-auth-file PATH (containers auth.json)",
        pull.NETWORK: "check the name and the network; a registry without TLS needs"
        " --insecure-registry HOST",
        pull.NO_PLATFORM: "choose one the image has with --platform OS/ARCH",
        pull.TOO_LARGE: "raise the limit with --image-size-limit BYTES (default: the store's"
        " size, --image-store-size)",
    }
    hint = hints.get(exc.reason)
    return f"{message}; {hint}" if hint and hint not in message else message
