"""Files in a sandbox through execd: streamed upload and download, and file-system calls."""

from __future__ import annotations

import builtins
import json
import os
import secrets
from contextlib import contextmanager, nullcontext
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    TypeAlias,
    TypeVar,
)

import requests
import urllib3

from . import _answers as answers
from ._constants import CHUNK_SIZE, MAX_OUTPUT_BYTES
from ._errors import (
    ConfigurationError,
    NotFoundError,
    NotSupportedError,
    OutputLimitExceeded,
    StreamError,
    redact,
    with_suffix,
)
from ._execd import LISTING_BYTES
from ._models import FileInfo, mode_to_wire
from ._transport import answer_socket
from ._wait import Wait
from ._watchdog import Cutoff

if TYPE_CHECKING:
    from ._execd import Execd

Data: TypeAlias = str | bytes | IO[bytes]
T = TypeVar("T")


class _Part:
    """One file of a multipart upload: its JSON metadata part, then its content part."""

    def __init__(
        self,
        path: str,
        data: Data,
        mode: int,
        owner: str | None,
        group: str | None,
        size: int | None = None,
    ):
        if not isinstance(path, str) or not path:
            raise ConfigurationError("a file path must be a non-empty str")
        if isinstance(data, str):
            data = data.encode("utf-8")
        self.data = data
        if isinstance(data, bytes):
            self.size = len(data)
        elif size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ConfigurationError(f"size must be an int from 0, got {size!r:.40}")
            self.size = size
        else:
            self.size = _remaining_size(data)
        meta = {"path": path, "mode": mode_to_wire(mode), "owner": owner, "group": group}
        self.metadata = json.dumps(meta).encode()

    def chunks(self) -> Iterator[bytes]:
        if isinstance(self.data, bytes):
            yield self.data
            return
        left = self.size
        while left > 0:
            chunk = self.data.read(min(CHUNK_SIZE, left))
            if not chunk:
                raise ConfigurationError("a file shrank while it was being uploaded")
            left -= len(chunk)
            yield chunk


def _remaining_size(handle: IO[bytes]) -> int:
    """Bytes left in a seekable binary file object (needed for Content-Length)."""
    try:
        here = handle.tell()
        end = handle.seek(0, os.SEEK_END)
        handle.seek(here)
    except (AttributeError, OSError, ValueError) as exc:
        raise ConfigurationError("file objects to upload must be binary and seekable") from exc
    return end - here


class MultipartBody:
    """A ``multipart/form-data`` body streamed part by part, with a known length.

    Paired parts named ``metadata`` and ``file``, both with a filename, as execd requires.
    ``requests`` reads ``len()`` for Content-Length and iterates, so a large file is never held
    in memory.
    """

    def __init__(self, parts: list[_Part]):
        self.boundary = "osb-sync-" + secrets.token_hex(16)
        self._pieces: list[tuple[bytes, _Part | None]] = []
        for part in parts:
            self._pieces.append((self._head("metadata", "metadata", "application/json"), None))
            self._pieces.append((part.metadata + b"\r\n", None))
            self._pieces.append((self._head("file", "file", "application/octet-stream"), part))
            self._pieces.append((b"\r\n", None))
        self._pieces.append((f"--{self.boundary}--\r\n".encode(), None))

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def _head(self, name: str, filename: str, content_type: str) -> bytes:
        return (
            f"--{self.boundary}\r\n"
            f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n"
        ).encode()

    def __len__(self) -> int:
        return sum(len(head) + (part.size if part else 0) for head, part in self._pieces)

    def whole(self) -> bytes | None:
        """The body as one ``bytes`` (sent in one write, not one per piece) when every file is
        in memory and it is at most CHUNK_SIZE long; None for one to stream."""
        if any(part is not None and not isinstance(part.data, bytes) for _, part in self._pieces):
            return None
        if len(self) > CHUNK_SIZE:
            return None
        return b"".join(self)

    def __iter__(self) -> Iterator[bytes]:
        for head, part in self._pieces:
            yield head
            if part is not None:
                yield from part.chunks()


class Files:
    """``sandbox.files``: the sandbox's file system, through execd.

    Relative paths are resolved by execd (in the sandbox's working directory).

    execd is the sandbox's own process, which code running as root in it can replace, so what
    it answers is checked before it is used, and refused with an ``ApiError`` whose ``code``
    is ``INVALID_RESPONSE`` and whose message names the field: in ``info``, ``list`` and
    ``search``, a ``path`` that is not a clean absolute path (a ``..``, ``.`` or empty
    component: it could climb out of a directory it is joined to), or that is not beneath the
    directory listed or searched (when that was given as an absolute path), a ``size`` that is
    negative or past 2**63 - 1, a ``mode`` that is not octal digits up to 7777, a value of the
    wrong JSON type, an ``info`` entry for a path not asked for; a ``replace`` count that is not
    an int from 0; a download from ``start`` answered with the whole file; a body encoded
    (``Content-Encoding``), which is never inflated. An answer past its kind's size (a listing
    or a search 16 MiB, any other 1 MiB: parsed JSON takes up to 30 times its size) raises
    TransportError, and so does a call not answered whole within the client's
    ``call_timeout``. The content of a
    file is opaque: ``read_bytes`` reads at most ``max_bytes``, and ``download`` writes at most
    its ``max_bytes`` when given (a hostile execd can send bytes forever).
    """

    def __init__(self, execd: Execd, identity: tuple[int, int] | None = None):
        self._execd = execd
        # files as a user (execd 1.1.1, #2070): every route under /v1/filesystem/{uid}/{gid}
        self.identity = identity
        self._prefix = "" if identity is None else "/v1/filesystem/{}/{}".format(*identity)

    def __repr__(self) -> str:
        if self.identity is None:
            return "Files()"
        return "Files(uid={}, gid={})".format(*self.identity)

    def _request(self, method: str, path: str, **options: Any) -> requests.Response:
        """execd's answer to ``path`` (under the identity's prefix)."""
        with self._route_known():
            return self._execd.request(method, self._prefix + path, **options)

    def _answer(self, method: str, path: str, read: Callable[[Any], T], **options: Any) -> T:
        """execd's JSON answer to ``path`` (under the identity's prefix), read by ``read``."""
        with self._route_known():
            return self._execd.answer(method, self._prefix + path, read, **options)

    @contextmanager
    def _route_known(self) -> Iterator[None]:
        """A 404 that names no file, under the identity's prefix, is an execd without it."""
        try:
            yield
        except NotFoundError as exc:
            if self.identity is None or "FILE" in str(exc.code or ""):
                raise
            raise NotSupportedError(
                f"execd does not serve files as a user (/v1/filesystem/..., execd 1.1.1 and "
                f"later): {exc}",
                feature="files as a user",
                status_code=exc.status_code,
                code=exc.code,
                message=exc.message,
                request_id=exc.request_id,
                response=exc.response,
            ) from None

    def write(
        self,
        path: str,
        data: Data,
        *,
        mode: int = 0o644,
        owner: str | None = None,
        group: str | None = None,
        size: int | None = None,
    ) -> None:
        """Write one file (parents are created). ``data``: str, bytes or a binary file object,
        streamed; one that cannot seek (a pipe, a member of a tar stream) needs its ``size``,
        the bytes to send from it.

        Raises:
            ConfigurationError: a file object that cannot seek, without ``size``; or one that
                ends before ``size`` bytes.
            ApiError: execd refused the upload.
        """
        self._upload([_Part(path, data, mode, owner, group, size)])

    def write_many(
        self,
        entries: Mapping[str, Data] | Iterable[tuple[str, Data] | tuple[str, Data, int]],
    ) -> None:
        """Write several files in one request: a ``{path: data}`` dict, or ``(path, data)``
        and ``(path, data, mode)`` tuples.

        Raises:
            ConfigurationError: an entry that is not such a tuple, an empty path, a mode that
                is not an int, or a file object that is not seekable.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        if isinstance(entries, Mapping):
            entries = list(entries.items())
        parts = []
        for entry in entries:
            if not isinstance(entry, tuple) or len(entry) not in (2, 3):
                raise ConfigurationError(
                    "write_many takes a {path: data} dict or (path, data[, mode]) tuples, "
                    f"got {type(entry).__name__} {entry!r:.60}"
                )
            path, data, *rest = entry
            parts.append(_Part(path, data, rest[0] if rest else 0o644, None, None))
        if parts:
            self._upload(parts)

    def upload(self, local_path: str | os.PathLike[str], path: str, *, mode: int = 0o644) -> None:
        """Stream a local file into the sandbox without loading it into memory.

        Raises:
            OSError: the local file could not be read.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        with open(local_path, "rb") as handle:
            self._upload([_Part(path, handle, mode, None, None)])

    def _upload(self, parts: list[_Part]) -> None:
        body = MultipartBody(parts)
        self._request(
            "POST",
            "/files/upload",
            data=body.whole() or body,
            headers={"Content-Type": body.content_type},
        )

    def read_bytes(
        self, path: str, *, max_bytes: int = MAX_OUTPUT_BYTES, timeout: float | None = None
    ) -> bytes:
        """A whole file, up to ``max_bytes``, within ``timeout`` seconds (default: as any call
        whose whole answer it returns, the client's ``call_timeout`` for the headers and again
        for the body).

        Raises:
            NotFoundError: no such file.
            OutputLimitExceeded: the file is larger than ``max_bytes``.
            SandboxTimeoutError: not read within ``timeout``.
            StreamError: the download broke, or its body took longer than ``call_timeout``.
        """
        pieces: list[bytes] = []
        total = 0
        # Without a timeout, the body as any whole answer: call_timeout from its headers.
        body = self._execd.call_timeout if timeout is None else None
        for chunk in self._download(path, CHUNK_SIZE, 0, timeout, body):
            total += len(chunk)
            if total > max_bytes:
                raise _too_large(path, max_bytes)
            pieces.append(chunk)
        return b"".join(pieces)

    def read_text(
        self,
        path: str,
        encoding: str = "utf-8",
        *,
        timeout: float | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> str:
        """A whole file decoded as text (capped and bounded like :meth:`read_bytes`), or with
        ``offset`` and/or ``limit`` some of its lines (execd 1.1.1's line download, #1030).

        ``offset`` is the first line (1-based, default 1), ``limit`` the number of lines
        (default: all the rest); the lines come without their line ends (LF or CRLF), joined by
        ``"\\n"``, without a final one (``""`` past the end), decoded as UTF-8. A June execd
        ignores the two and sends the whole file: the lines are then picked here, the same way,
        from the file read up to the cap.

        Raises:
            ConfigurationError: ``offset`` or ``limit`` is not an int of 1 or more.
            NotFoundError: no such file.
            OutputLimitExceeded: the file (or the lines) is larger than the cap.
            SandboxTimeoutError: not read within ``timeout``.
            StreamError: the download broke, or its body took longer than ``call_timeout``.
            UnicodeDecodeError: the file is not text in ``encoding`` (the message names it).
        """
        if offset is not None or limit is not None:
            return self._read_lines(path, offset, limit, timeout)
        data = self.read_bytes(path, timeout=timeout)
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            exc.reason = (
                f"{exc.reason}: {path!r} is not {encoding} text (read_bytes reads any file)"
            )
            raise

    def _read_lines(
        self, path: str, offset: int | None, limit: int | None, timeout: float | None
    ) -> str:
        query: dict[str, int] = {}
        for name, value in (("offset", offset), ("limit", limit)):
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ConfigurationError(f"{name} must be an int of 1 or more, or None")
                query[name] = value
        kinds: list[str] = []
        pieces: list[bytes] = []
        total = 0
        body = self._execd.call_timeout if timeout is None else None
        chunks = self._download(path, CHUNK_SIZE, 0, timeout, body, query, kinds.append)
        for chunk in chunks:
            total += len(chunk)
            if total > MAX_OUTPUT_BYTES:
                raise _too_large(path, MAX_OUTPUT_BYTES)
            pieces.append(chunk)
        text = b"".join(pieces).decode("utf-8", "replace")
        if kinds and kinds[0].split(";")[0].strip().lower() == "text/plain":
            return text  # execd picked the lines
        return pick_lines(text, offset or 1, limit)  # June's execd sent the whole file

    def iter_bytes(
        self,
        path: str,
        chunk_size: int = CHUNK_SIZE,
        start: int = 0,
        *,
        timeout: float | None = None,
    ) -> Generator[bytes, None, None]:
        """Stream a file from byte ``start`` on (a Range request: resume after a failure).

        ``timeout`` (seconds, from the first read) bounds the whole download. Without it the
        answer's headers are bounded by the client's ``call_timeout``, and its body by the read
        timeout for each silence only: a hostile execd can keep a download alive with a byte
        now and then, until you stop iterating.

        Raises:
            NotFoundError: no such file.
            ApiError: ``code`` ``INVALID_RESPONSE``: execd answered a ``start`` with the whole
                file (a 200), or from another byte.
            SandboxTimeoutError: not whole within ``timeout``.
            StreamError: the download broke.
        """
        return self._download(path, chunk_size, start, timeout, None)

    def _download(
        self,
        path: str,
        chunk_size: int,
        start: int,
        timeout: float | None,
        body: float | None,
        query: Mapping[str, int] | None = None,
        content_type: Callable[[str], object] | None = None,
    ) -> Generator[bytes, None, None]:
        """:meth:`iter_bytes`, whose body (once its headers are in) is also cut ``body``
        seconds on (StreamError); ``query`` adds parameters, ``content_type`` is told the
        answer's."""
        headers = {"Range": f"bytes={start}-"} if start else None
        wait = None if timeout is None else Wait(f"the download of {path!r} did not end", timeout)
        try:
            with wait.bounding() if wait is not None else nullcontext():
                response = self._request(
                    "GET",
                    "/files/download",
                    params={"path": path, **(query or {})},
                    headers=headers,
                    stream=True,
                    deadline=None if wait is None else wait.deadline,
                )
        except NotFoundError as exc:
            raise with_suffix(exc, f"(path {path!r})") from None
        if content_type is not None:
            content_type(response.headers.get("Content-Type", ""))
        cutoff = None
        if wait is not None or body is not None:
            cutoff = Cutoff(None if wait is None else wait.deadline, body)
            cutoff.start(answer_socket(response))
        try:
            if start:
                _check_range(response, start)
            yield from _chunks_or_stream_error(response, chunk_size, self._execd.secrets)
            if cutoff is not None and cutoff.finish():  # a cut may look like the end
                raise StreamError("the connection was cut")
        except answers.BadAnswer as exc:
            raise self._execd.invalid(response, exc) from None
        except StreamError as exc:
            if cutoff is None or not cutoff.finish():
                raise
            if wait is not None and cutoff.by_deadline:
                raise wait.error() from exc
            raise StreamError(
                f"the download of {path!r} was not whole within {cutoff.describe()}: the "
                "connection was cut"
            ) from exc
        finally:
            if cutoff is not None:
                cutoff.finish()  # before the connection can go back to the pool
            response.close()

    def download(
        self,
        path: str,
        local_path: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Stream a file to a local path; returns the bytes written.

        ``max_bytes`` bounds what is written, ``timeout`` (seconds) how long it takes (default:
        no bound, the file's size and the time it takes; execd is the sandbox's, and a hostile
        one can send bytes forever, or a byte now and then).

        Raises:
            NotFoundError: no such file.
            OutputLimitExceeded: the file is larger than ``max_bytes`` (the local file then
                holds its first ``max_bytes`` bytes).
            SandboxTimeoutError: not whole within ``timeout``.
            StreamError: the download broke.
            OSError: the local file could not be written.
        """
        written = 0
        with open(local_path, "wb") as handle:
            for chunk in self.iter_bytes(path, timeout=timeout):
                if max_bytes is not None and written + len(chunk) > max_bytes:
                    handle.write(chunk[: max_bytes - written])
                    raise _too_large(path, max_bytes)
                handle.write(chunk)
                written += len(chunk)
        return written

    def info(self, *paths: str) -> dict[str, FileInfo]:
        """Stat files.

        Raises:
            NotFoundError: one of them does not exist.
            ApiError: an answer the client cannot use (``code`` ``INVALID_RESPONSE``; see the
                class).
        """
        try:
            return self._answer(
                "GET",
                "/files/info",
                lambda data: answers.file_infos_by_path(data, paths),
                params={"path": list(paths)},
            )
        except NotFoundError as exc:
            raise with_suffix(exc, f"(paths {list(paths)!r})") from None

    def exists(self, path: str) -> bool:
        """Whether a file or directory exists.

        Raises:
            ApiError: execd refused the call for another reason than a missing path.
            TransportError: execd could not be reached.
        """
        try:
            return bool(self.info(path))
        except NotFoundError:
            return False

    def list(self, path: str, depth: int = 1) -> builtins.list[FileInfo]:
        """A directory's entries (``depth`` levels deep).

        Raises:
            NotFoundError: no such directory.
            ApiError: execd refused the call, or answered an entry the client cannot use
                (``code`` ``INVALID_RESPONSE``; see the class).
            TransportError: execd could not be reached.
        """
        return self._answer(
            "GET",
            "/directories/list",
            lambda data: answers.file_infos(data, path),
            max_body=LISTING_BYTES,
            params={"path": path, "depth": depth},
        )

    def search(self, path: str, pattern: str = "**") -> builtins.list[FileInfo]:
        """Files under ``path`` whose name matches the glob ``pattern``.

        Raises:
            NotFoundError: no such directory.
            ApiError: execd refused the call, or answered an entry the client cannot use
                (``code`` ``INVALID_RESPONSE``; see the class).
            TransportError: execd could not be reached.
        """
        return self._answer(
            "GET",
            "/files/search",
            lambda data: answers.file_infos(data, path),
            max_body=LISTING_BYTES,
            params={"path": path, "pattern": pattern},
        )

    def remove(self, *paths: str) -> None:
        """Delete files (a missing one is fine).

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._request("DELETE", "/files", params={"path": list(paths)})

    def mkdir(self, path: str, *, mode: int = 0o755) -> None:
        """Create a directory and its parents.

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._request("POST", "/directories", json={path: {"mode": mode_to_wire(mode)}})

    def rmtree(self, path: str) -> None:
        """Delete a directory and everything in it.

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._request("DELETE", "/directories", params={"path": path})

    def move(self, src: str, dest: str) -> None:
        """Move or rename.

        Raises:
            NotFoundError: no such source.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._request("POST", "/files/mv", json=[{"src": src, "dest": dest}])

    def chmod(
        self, path: str, mode: int, owner: str | None = None, group: str | None = None
    ) -> None:
        """Change permissions (and owner/group when given).

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        entry: dict[str, Any] = {"mode": mode_to_wire(mode)}
        if owner is not None:
            entry["owner"] = owner
        if group is not None:
            entry["group"] = group
        self._request("POST", "/files/permissions", json={path: entry})

    def replace(self, path: str, old: str, new: str) -> int:
        """Replace every ``old`` with ``new`` in a file; returns how many were replaced.

        Raises:
            ConfigurationError: an empty ``old``.
            NotFoundError: no such file.
            ApiError: execd refused the call, or answered a count that is not an int from 0
                (``code`` ``INVALID_RESPONSE``).
            TransportError: execd could not be reached.
        """
        if not old:
            raise ConfigurationError("replace needs a non-empty old text")
        return self._answer(
            "POST",
            "/files/replace",
            lambda data: answers.replaced_count(data, path),
            params={"verbose": "true"},
            json={path: {"old": old, "new": new}},
        )


def pick_lines(text: str, offset: int, limit: int | None) -> str:
    """Lines ``offset`` to ``offset + limit - 1`` (1-based) of ``text``, without their LF or
    CRLF, joined by LF: what execd 1.1.1 answers a line download."""
    start = _after_lines(text, 0, offset - 1)
    if start is None:
        return ""
    end = None if limit is None else _after_lines(text, start, limit)
    chosen = text[start:end]
    if chosen.endswith("\n"):
        chosen = chosen[:-1]  # the last line's newline ends it; it starts none
    if chosen.endswith("\r"):
        chosen = chosen[:-1]
    # A slice, never a list of lines: a file of short lines would cost 20 times its size.
    return chosen.replace("\r\n", "\n")


def _after_lines(text: str, at: int, count: int) -> int | None:
    """Where the text after ``count`` more newlines from ``at`` starts; None if it has fewer."""
    for _ in range(count):
        at = text.find("\n", at) + 1
        if not at:
            return None
    return at


def _too_large(path: str, max_bytes: int) -> OutputLimitExceeded:
    return OutputLimitExceeded(
        f"file {path} exceeded {max_bytes} bytes (raise max_bytes to allow more)",
        limit=max_bytes,
    )


def _check_range(response: requests.Response, start: int) -> None:
    """A download from byte ``start`` must be a 206 (a 200 is the whole file: the caller would
    take its first bytes for the ones after ``start``), from that byte if it says."""
    content_range = response.headers.get("Content-Range")
    from_start = content_range is None or content_range.startswith(f"bytes {start}-")
    if response.status_code != 206 or not from_start:
        raise answers.BadAnswer(
            f"the answer to a download from byte {start}",
            "is not a 206 from that byte",
            f"status {response.status_code}, Content-Range {content_range}",
        )


def _chunks_or_stream_error(
    response: requests.Response, chunk_size: int, secrets: tuple[str, ...]
) -> Iterator[bytes]:
    try:
        yield from response.iter_content(chunk_size)
        return
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        text = f"{type(exc).__name__}: {exc}"
        error = StreamError(f"the download broke: {redact(text, secrets)}")
        if redact(text, secrets) == text:
            raise error from exc
    # Outside the except: chained, the wire's error would show the secret the peer sent
    # (urllib3 quotes a bad chunk-size line).
    raise error
