"""A one-file Django project whose view runs user-submitted Python in pooled sandboxes.

    python examples/django_app.py
    curl -s http://127.0.0.1:8000/run --data-binary 'print(6 * 7)'

With ``OPEN_SANDBOX_API_BASE`` (and ``OPEN_SANDBOX_API_KEY``) set it uses that server; otherwise
it starts an embedded local server (a development server, not a security boundary). ``PORT``
(default 8000), ``POOL_SIZE`` (default 4) and ``OPENSANDBOX_POOL_REDIS_URL`` (one pool shared
by every worker process through Redis; default none) are read from the environment. Extra
arguments go to Django's command line instead of ``runserver`` (``python examples/django_app.py
check``). Under a WSGI server, ``application`` configures the project from the environment on
first use (``OPEN_SANDBOX_API_BASE=... gunicorn --chdir examples django_app:application``).

``POST /run`` takes the code as the request body and answers
``{"stdout", "stderr", "results", "error", "execution_count"}``; a run past ``RUN_TIMEOUT`` or
``MAX_OUTPUT_BYTES`` gets an ``error``, an empty body 400, a body over ``MAX_CODE_BYTES`` 413,
and 503 means every sandbox stayed busy. Every error answer is JSON ``{"error": ...}``, as the
API's own (Django's default 400, 404 and 500 pages are HTML: this URLconf replaces them).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import django
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

from osb_sync import OutputLimitExceeded, SandboxTimeoutError
from osb_sync.integrations.django import get_pool, request_sandbox

RUN_TIMEOUT = 10.0  # seconds one submission may run
MAX_OUTPUT_BYTES = 64 * 1024  # output kept per run; more interrupts the run
MAX_CODE_BYTES = 64 * 1024
EMPTY_BODY = "the request body is empty: send the code to run"


def configure(api_base: str | None = None, api_key: str | None = None) -> None:
    """Settings for this one-file project; ``api_base`` default: ``OPEN_SANDBOX_API_BASE``."""
    settings.configure(
        DEBUG=False,
        SECRET_KEY=os.environ.get("DJANGO_SECRET_KEY", "example-only-" + "x" * 40),
        ALLOWED_HOSTS=["127.0.0.1", "localhost", "testserver"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=[],  # a JSON API for scripts: no sessions, no CSRF cookies
        INSTALLED_APPS=[],
        DATABASES={},
        DATA_UPLOAD_MAX_MEMORY_SIZE=MAX_CODE_BYTES,
        OPENSANDBOX={
            "API_BASE": api_base,
            "API_KEY": api_key,
            "POOL_SIZE": int(os.environ.get("POOL_SIZE", "4")),
            "POOL_REDIS_URL": os.environ.get("OPENSANDBOX_POOL_REDIS_URL") or None,
            "REUSE": "never",  # each submission gets a sandbox no one has used
            "CREATE": {"timeout": 900},  # sandboxes expire if this process dies
            "ACQUIRE_TIMEOUT": 5.0,
        },
    )
    django.setup()


def run(request: HttpRequest) -> HttpResponse:
    """Run the body as Python in the request's pooled sandbox."""
    if request.method != "POST":
        refused = JsonResponse({"error": "POST the code to run"}, status=405)
        refused["Allow"] = "POST"
        return refused
    try:
        body = request.body
    except RequestDataTooBig:  # past DATA_UPLOAD_MAX_MEMORY_SIZE; Django would answer 400
        return JsonResponse({"error": f"the code is over {MAX_CODE_BYTES} bytes"}, status=413)
    code = body.decode("utf-8", "replace")
    if not code.strip():
        return JsonResponse({"error": EMPTY_BODY}, status=400)
    try:
        sandbox = request_sandbox(request)  # given back when the response is finished
    except SandboxTimeoutError:
        response = JsonResponse({"error": "all sandboxes are busy, try again"}, status=503)
        response["Retry-After"] = "1"
        return response
    try:
        result = sandbox.run_code(code, timeout=RUN_TIMEOUT, max_output_bytes=MAX_OUTPUT_BYTES)
    except SandboxTimeoutError:
        return JsonResponse(_stopped("TimeoutError", f"stopped after {RUN_TIMEOUT:g} seconds"))
    except OutputLimitExceeded:
        return JsonResponse(_stopped("OutputLimitExceeded", f"over {MAX_OUTPUT_BYTES} bytes"))
    return JsonResponse(result.to_dict())


def _stopped(name: str, why: str) -> dict[str, Any]:
    """The answer for a run that was interrupted (its sandbox is then discarded)."""
    error = {"name": name, "value": why, "traceback": []}
    return {"stdout": "", "stderr": "", "results": [], "error": error, "execution_count": None}


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 400 (a bad Host header, a malformed request), as JSON."""
    return JsonResponse({"error": "bad request"}, status=400)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 404, as JSON."""
    return JsonResponse({"error": "not found: the one route is POST /run"}, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's 500, as JSON (the traceback goes to the log, never to the client)."""
    return JsonResponse({"error": "internal error"}, status=500)


urlpatterns = [path("run", run)]
handler400 = bad_request
handler404 = not_found
handler500 = server_error


def __getattr__(name: str) -> Any:
    """``application``, the WSGI callable of a WSGI server (gunicorn ``django_app:application``),
    made on first use: the project configured from ``OPEN_SANDBOX_API_BASE``.

    Raises:
        RuntimeError: ``OPEN_SANDBOX_API_BASE`` is not set (at start-up, not on a request).
        AttributeError: any other name.
    """
    if name != "application":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not settings.configured:
        api_base = os.environ.get("OPEN_SANDBOX_API_BASE")
        if not api_base:
            raise RuntimeError(
                "application needs an OpenSandbox server: set OPEN_SANDBOX_API_BASE; "
                "`python examples/django_app.py` starts an embedded local one"
            )
        configure(api_base, os.environ.get("OPEN_SANDBOX_API_KEY"))
    from django.core.wsgi import get_wsgi_application

    handler = get_wsgi_application()
    globals()["application"] = handler
    return handler


def main(argv: list[str]) -> None:
    """Serve on 127.0.0.1:$PORT, with an embedded local server unless one is configured."""
    from django.core.management import execute_from_command_line

    local = None
    api_base = os.environ.get("OPEN_SANDBOX_API_BASE")
    if not api_base:
        from osb_sync.local import LocalServer

        local = LocalServer(unenforced_network_policy="accept").start()
        api_base = local.api_base
        print(f"embedded local OpenSandbox server on {api_base}", file=sys.stderr)
        if not local.network_policy_enforced:
            print("warning: this machine cannot enforce the deny-all policy", file=sys.stderr)
    configure(api_base)
    get_pool()  # start filling the pool before the first request
    address = f"127.0.0.1:{os.environ.get('PORT', '8000')}"
    # --noreload: the autoreloader would run this file again in a child process
    command = argv[1:] or ["runserver", "--noreload", address]
    try:
        execute_from_command_line([argv[0], *command])
    finally:
        from osb_sync.integrations.django import close

        close()
        if local is not None:
            local.stop()


if __name__ == "__main__":
    main(sys.argv)
