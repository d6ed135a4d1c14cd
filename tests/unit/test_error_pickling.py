"""Every error pickles as its class and fields: a process pool or a task queue (Celery's pickle
serializer) sends a worker's exception back that way, and errors with keyword-only fields
failed to unpickle ("missing 1 required keyword-only argument: 'status_code'"). What stays
behind: the response and its request (the API key is in the request's headers), and a partial
result that does not pickle."""

from __future__ import annotations

import inspect
import multiprocessing
import pickle
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import responses

from osb_sync import Client, _errors
from osb_sync._constants import API_KEY_HEADER

BASE = "http://osb.test/v1"
KEY = "key-4f1b9c2d7e"
SID = "sbx-1"

# the keyword-only fields each class needs (the others take their defaults)
FIELDS: dict[str, dict[str, Any]] = {
    "OutputLimitExceeded": {"limit": 10, "partial": {"stdout": "so far"}},
    "CommandFailed": {"exit_code": 2, "stderr": "no such file"},
    "StreamError": {"partial": ["kept"]},
    "NotSupportedError": {"feature": "pty", "server_version": "1.0", "status_code": 501},
    "CapacityError": {"retry_after": 2.5, "status_code": 429, "code": "X", "request_id": "r"},
}
API_FIELDS = {"status_code": 500, "code": "DOCKER::X", "message": "m", "request_id": "r-1"}
CLASSES = sorted(
    (cls for _, cls in inspect.getmembers(_errors, inspect.isclass)
     if issubclass(cls, _errors.OpenSandboxError) and cls is not _errors.OpenSandboxError),
    key=lambda cls: cls.__name__,
)  # fmt: skip


def sample(cls: type[_errors.OpenSandboxError]) -> _errors.OpenSandboxError:
    if cls.__name__ in FIELDS:
        return cls("it failed", **FIELDS[cls.__name__])  # type: ignore[call-arg]
    if issubclass(cls, _errors.ApiError):
        return cls("it failed", **API_FIELDS)
    return cls("it failed")


def fields(exc: BaseException) -> dict[str, Any]:
    found = {k: v for k, v in vars(exc).items() if k not in ("response", "request")}
    if isinstance(exc, _errors.OutputLimitExceeded):
        found["partial"] = exc.partial
    found.pop("_build_partial", None)
    found.pop("_partial", None)
    return found


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_pickles_as_its_class_and_fields(cls: type[_errors.OpenSandboxError]) -> None:
    exc = sample(cls)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert str(back) == str(exc) and back.args == exc.args
    assert fields(back) == fields(exc)


def test_the_response_and_its_api_key_stay_behind() -> None:
    with responses.RequestsMock() as mocked:
        body = {"code": "DOCKER::SANDBOX_NOT_FOUND", "message": "no such sandbox"}
        mocked.get(f"{BASE}/sandboxes/{SID}", json=body, status=404)
        with Client(BASE, api_key=KEY) as client, pytest.raises(_errors.NotFoundError) as caught:
            client.get_sandbox(SID)
    exc = caught.value
    assert exc.response is not None and exc.response.request.headers[API_KEY_HEADER] == KEY
    data = pickle.dumps(exc)
    assert KEY.encode() not in data
    back = pickle.loads(data)
    assert type(back) is _errors.NotFoundError and back.response is None
    assert (back.status_code, back.code) == (404, "DOCKER::SANDBOX_NOT_FOUND")
    assert str(back) == str(exc)


def test_a_partial_result_is_built_once_and_one_that_does_not_pickle_stays_behind() -> None:
    built: list[int] = []
    limited = _errors.OutputLimitExceeded("cap", limit=4)
    limited.partial_from(lambda: built.append(1) or "kept")
    assert pickle.loads(pickle.dumps(limited)).partial == "kept" and built == [1]
    broken = _errors.StreamError("broke", partial=threading.Lock())
    back = pickle.loads(pickle.dumps(broken))
    assert back.partial is None and str(back) == "broke"


def _raise_in_worker(status: int) -> None:
    raise _errors.ApiError("from the worker", status_code=status, code="X", message="m")


def test_a_process_pool_worker_s_error_reaches_the_caller_whole() -> None:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        future = pool.submit(_raise_in_worker, 503)
        with pytest.raises(_errors.ApiError) as caught:
            future.result(timeout=60)
    assert (caught.value.status_code, caught.value.code) == (503, "X")
    assert str(caught.value) == "from the worker"
