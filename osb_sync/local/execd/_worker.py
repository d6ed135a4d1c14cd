"""Persistent Python worker of one local code context; run as a script, standard library only.

Usage: `_worker.py REQUEST_FD REPLY_FD`. Each request is one JSON line `{"code": "..."}` on
REQUEST_FD; each reply is one JSON line on REPLY_FD, written after the code finished:
`{"execution_count": n, "result": bundle|null, "error": {ename, evalue, traceback}|null}`, the
bundle mapping "text" to the repr and other MIME types to the `_repr_*_` methods' output.
Output is not framed: the code's stdout and stderr are the worker's own file descriptors 1 and 2
(unbuffered, `-u`), which the server reads as live streams, so output of child processes is
captured too. SIGINT interrupts running code with KeyboardInterrupt and is ignored between runs.
"""

from __future__ import annotations

# What a worker imports before the first run is on every sandbox's path to ready: `_ast` (the
# parser's nodes, without `ast`'s helpers and their imports) and no `typing`; `traceback` and
# `base64` only when a run needs them.
import _ast
import builtins
import json
import linecache
import os
import signal
import sys
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_running = False
REPLY_LIMIT = 4 << 20  # pyworker.REPLY_LIMIT: the server kills a worker whose reply is larger
# The rich representations IPython's display formatter asks for, as real execd reports them.
MIME_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
    ("application/pdf", "_repr_pdf_"),
)


def _on_sigint(signum: int, frame: types.FrameType | None) -> None:
    if _running:
        raise KeyboardInterrupt


class StdinNotImplementedError(NotImplementedError):
    """What `input()` raises in a kernel whose client takes no input, as in real execd."""


def _no_input(prompt: object = "") -> str:
    raise StdinNotImplementedError(
        "raw_input was called, but this frontend does not support input requests."
    )


def _error(exc: BaseException) -> dict[str, Any]:
    """The error reply for `exc`, its traceback cut to the user's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {"ename": type(exc).__name__, "evalue": str(exc), "traceback": text.splitlines()}


def _bundle(value: Any) -> dict[str, Any]:
    """`repr(value)` under "text", plus what its `_repr_*_` methods give (bytes as base64)."""
    bundle: dict[str, Any] = {"text": repr(value)}
    if isinstance(value, type):
        return bundle  # a class's methods are not representations of the class
    for mime, method in MIME_METHODS:
        try:
            data = getattr(value, method)()
        except Exception:  # noqa: BLE001, S112 - a missing or failing method: no such form
            continue
        if isinstance(data, tuple):  # IPython's (data, metadata) form
            data = data[0]
        if isinstance(data, bytes):
            import base64

            data = base64.b64encode(data).decode("ascii")
        if data is not None and _encodable(data):
            bundle[mime] = data
    return bundle


def _encodable(data: Any) -> bool:
    try:
        json.dumps(data)
    except (TypeError, ValueError):
        return False
    return True


def execute(code: str, namespace: dict[str, Any], count: int) -> dict[str, Any]:
    """Run `code` in `namespace`; the value of a trailing expression becomes the result."""
    global _running
    filename = f"<cell-{count}>"
    # Registering the source lets tracebacks show the offending lines, as a notebook does.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    reply: dict[str, Any] = {"execution_count": count, "result": None, "error": None}
    _running = True
    try:
        tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST)  # ast.parse
        assert isinstance(tree, _ast.Module)
        last = None
        tail = tree.body[-1] if tree.body else None
        if isinstance(tail, _ast.Expr) and not code.rstrip().endswith(";"):
            tree.body.pop()
            last = _ast.Expression(tail.value)
        # Running the user's code is the whole point of this worker.
        exec(compile(tree, filename, "exec"), namespace)  # noqa: S102
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)  # noqa: S307
            if value is not None:
                namespace["_"] = value
                reply["result"] = _bundle(value)
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything, even SystemExit
        reply["error"] = _error(exc)
    finally:
        _running = False
    return reply


def _encode(reply: dict[str, Any]) -> bytes:
    """The reply as one JSON line; an error in its place when it cannot be sent."""
    try:
        data = json.dumps(reply).encode()
    except (TypeError, ValueError):
        problem = "unencodable"
    else:
        if len(data) <= REPLY_LIMIT:
            return data
        problem = f"the result is {len(data)} bytes, more than {REPLY_LIMIT}: print it instead"
    error = {"ename": "WorkerError", "evalue": problem, "traceback": []}
    return json.dumps({**reply, "result": None, "error": error}).encode()


def main(argv: list[str]) -> int:
    """Serve requests until the request pipe closes."""
    requests = os.fdopen(int(argv[1]), "rb")
    replies = os.fdopen(int(argv[2]), "wb", buffering=0)
    # The worker's directory must not shadow the user's imports; a notebook has cwd first.
    sys.path[0] = ""
    main_module = types.ModuleType("__main__")
    main_module.__dict__["__builtins__"] = __builtins__
    builtins.input = _no_input
    sys.modules["__main__"] = main_module
    signal.signal(signal.SIGINT, _on_sigint)
    count = 0
    for line in requests:
        count += 1
        reply = execute(json.loads(line)["code"], main_module.__dict__, count)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        replies.write(_encode(reply) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
