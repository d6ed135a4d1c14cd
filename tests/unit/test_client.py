"""Request shapes and lifecycle behaviour, with `responses` (no sockets)."""

from __future__ import annotations

import inspect
import logging
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import responses
import urllib3
from responses.registries import OrderedRegistry

import osb_sync
from osb_sync import (
    ApiError,
    Client,
    ConfigurationError,
    NotFoundError,
    OutputLimitExceeded,
    SandboxStateError,
    SandboxTimeoutError,
    TransportError,
    _cli_sandboxes,
)
from tests.helpers import (
    API,
    ENDPOINT,
    KEY,
    SID,
    TOKEN,
    Clock,
    add_create,
    add_delete,
    add_endpoint,
    add_ping,
    add_run,
    body_of,
    created_body,
    sandbox_body,
)

CREATE_ID_KEY = "osb-sync/create-id"  # the documented tag of every create


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        add_ping(mock)
        yield mock


@pytest.fixture
def ordered() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(registry=OrderedRegistry) as mock:
        yield mock


@pytest.fixture
def client() -> Iterator[Client]:
    with Client(API, KEY) as c:
        yield c


def calls(rsps: responses.RequestsMock) -> list[tuple[str, str]]:
    return [(c.request.method or "", urlsplit(c.request.url or "").path) for c in rsps.calls]


# -- configuration ------------------------------------------------------------------------


def test_api_base_strips_trailing_slash() -> None:
    assert Client("http://h:8080/v1/").api_base == "http://h:8080/v1"


def test_api_base_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPEN_SANDBOX_API_BASE", "http://env:1/v1")
    monkeypatch.setenv("OPEN_SANDBOX_DOMAIN", "ignored:2")
    assert Client().api_base == "http://env:1/v1"


@pytest.mark.parametrize(
    ("domain", "expected"),
    [("sbx.local:8080", "http://sbx.local:8080/v1"), ("https://sbx.io/", "https://sbx.io/v1")],
)
def test_api_base_from_sdk_domain(
    monkeypatch: pytest.MonkeyPatch, domain: str, expected: str
) -> None:
    monkeypatch.setenv("OPEN_SANDBOX_DOMAIN", domain)
    assert Client().api_base == expected


def test_missing_api_base_names_the_env_var() -> None:
    with pytest.raises(ConfigurationError, match="api_base is required") as info:
        Client()
    assert "OPEN_SANDBOX_API_BASE" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad", ["ftp://h/v1", "h:8080/v1", "http:///v1"])
def test_bad_api_base_is_rejected(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="http"):
        Client(bad)


@pytest.mark.parametrize(
    "kwargs",
    [{"read_timeout": 0}, {"pool_maxsize": 0}, {"max_retries": -1}, {"execd_scheme": "ftp"}],
)
def test_bad_client_arguments_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        Client(API, **kwargs)


def test_explicit_empty_key_wins_over_env_and_sends_no_header(
    monkeypatch: pytest.MonkeyPatch, rsps: responses.RequestsMock
) -> None:
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", "from-env")
    add_delete(rsps)
    Client(API, "").delete_sandbox(SID)
    assert "OPEN-SANDBOX-API-KEY" not in rsps.calls[0].request.headers


def test_key_from_env_is_sent_to_lifecycle(
    monkeypatch: pytest.MonkeyPatch, rsps: responses.RequestsMock
) -> None:
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", "from-env")
    add_delete(rsps)
    Client(API).delete_sandbox(SID)
    assert rsps.calls[0].request.headers["OPEN-SANDBOX-API-KEY"] == "from-env"


def test_reprs_show_no_secrets(client: Client) -> None:
    sandbox = osb_sync.Sandbox.from_execd(
        f"http://{ENDPOINT}", headers={"X-EXECD-ACCESS-TOKEN": TOKEN}, sandbox_id=SID
    )
    assert SID in repr(sandbox) and ENDPOINT in repr(sandbox)
    assert TOKEN not in repr(sandbox) and KEY not in repr(client)


# -- create body ----------------------------------------------------------------------------


def test_default_create_body() -> None:
    body = created_body()
    assert body == {
        "image": {"uri": "opensandbox/code-interpreter:v1.1.0"},
        "entrypoint": ["/opt/code-interpreter/code-interpreter.sh"],
        "timeout": 300,
        "resourceLimits": {"cpu": "1", "memory": "2Gi"},
        "networkPolicy": {"defaultAction": "deny", "egress": []},
    }


def test_the_default_resource_limits_are_read_only() -> None:
    with pytest.raises(TypeError):
        osb_sync.DEFAULT_RESOURCE_LIMITS["cpu"] = "64"  # type: ignore[index]
    assert created_body()["resourceLimits"] == {"cpu": "1", "memory": "2Gi"}


def test_create_options_are_one_signature() -> None:
    signature = inspect.signature(Client.create_sandbox)
    keywords = [p for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert len(keywords) == 23 and signature.parameters["health_check"].default is True
    assert signature.parameters["template"].default is None
    with pytest.raises(TypeError, match="unexpected keyword argument 'tempalte'"):
        Client(API).create_sandbox(tempalte="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="SandboxPool\\(\\) got an unexpected keyword"):
        osb_sync.SandboxPool(Client(API), size=0, tempalte="x")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("kwargs", "policy"),
    [
        ({"allow_internet_access": None}, {"defaultAction": "deny", "egress": []}),
        ({"allow_internet_access": False}, {"defaultAction": "deny", "egress": []}),
        ({"allow_internet_access": True}, None),
        ({"allow_internet_access": True, "network_policy": {}}, {}),
        ({"network_policy": {"defaultAction": "allow"}}, {"defaultAction": "allow"}),
    ],
)
def test_network_policy_is_deny_all_unless_asked(kwargs: dict[str, Any], policy: Any) -> None:
    assert created_body(**kwargs).get("networkPolicy") == policy


def test_full_create_request(client: Client, rsps: responses.RequestsMock) -> None:
    add_create(rsps)
    add_endpoint(rsps)
    client.create_sandbox(
        template="img:1",
        timeout=900,
        metadata={"team": "ml"},
        env_vars={"A": "1"},
        resource_limits={"cpu": "2"},
        resource_requests={"cpu": "500m"},
        entrypoint=("/bin/run", "x"),
        secure_access=True,
        allow_internet_access=True,
        use_server_proxy=True,
    )
    body = body_of(rsps.calls[0])
    create_id = body["metadata"].pop(CREATE_ID_KEY)
    assert len(create_id) == 16 and create_id.isalnum()
    assert body == {
        "image": {"uri": "img:1"},
        "entrypoint": ["/bin/run", "x"],
        "timeout": 900,
        "resourceLimits": {"cpu": "2"},
        "metadata": {"team": "ml"},
        "env": {"A": "1"},
        "resourceRequests": {"cpu": "500m"},
        "secureAccess": True,
    }
    assert rsps.calls[0].request.headers["OPEN-SANDBOX-API-KEY"] == KEY
    assert parse_qs(urlsplit(rsps.calls[1].request.url).query) == {"use_server_proxy": ["true"]}


def test_create_tags_differ_between_creates(client: Client, rsps: responses.RequestsMock) -> None:
    add_create(rsps)
    add_endpoint(rsps)
    client.create_sandbox()
    client.create_sandbox()
    tags = [body_of(c)["metadata"][CREATE_ID_KEY] for c in rsps.calls if c.request.method == "POST"]
    assert len(set(tags)) == 2


def test_numeric_id_is_stringified(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.post(f"{API}/sandboxes", json={"id": 7, "status": {"state": "Running"}}, status=202)
    add_endpoint(rsps, sid="7")
    assert client.create_sandbox().id == "7"


# -- waiting ------------------------------------------------------------------------------


def test_running_create_does_not_poll_or_sleep(
    client: Client, ordered: responses.RequestsMock, clock: Clock
) -> None:
    add_create(ordered)
    add_endpoint(ordered)
    add_ping(ordered)
    sandbox = client.create_sandbox()
    assert clock.sleeps == []
    assert sandbox.execd_url == f"http://{ENDPOINT}"
    assert sandbox.execd_headers == {"X-EXECD-ACCESS-TOKEN": TOKEN}
    assert sandbox.delete_on_exit is True


def test_polls_with_exactly_one_sleep_between_polls(
    client: Client, ordered: responses.RequestsMock, clock: Clock
) -> None:
    add_create(ordered, state="Pending")
    for state in ("Pending", "Allocated", "Unknown"):
        ordered.get(f"{API}/sandboxes/{SID}", json=sandbox_body(state))
    ordered.get(f"{API}/sandboxes/{SID}", json=["garbage"])
    ordered.get(f"{API}/sandboxes/{SID}", json={"id": SID, "status": "weird"})
    ordered.get(f"{API}/sandboxes/{SID}", json=sandbox_body("Running"))
    add_endpoint(ordered)
    add_ping(ordered)
    client.create_sandbox(poll_interval=0.5)
    assert clock.sleeps == [0.5] * 6


@pytest.mark.parametrize("state", ["Failed", "Stopping", "Terminated"])
def test_fatal_state_raises_and_deletes(
    client: Client, rsps: responses.RequestsMock, clock: Clock, state: str
) -> None:
    add_create(rsps, state="Pending")
    rsps.get(
        f"{API}/sandboxes/{SID}",
        json=sandbox_body(state, status={"state": state, "reason": "CONTAINER_EXITED_ERROR"}),
    )
    add_delete(rsps)
    with pytest.raises(SandboxStateError, match=f"sandbox {SID} entered {state}") as info:
        client.create_sandbox()
    assert "CONTAINER_EXITED_ERROR" in str(info.value)
    assert calls(rsps)[-1] == ("DELETE", f"/v1/sandboxes/{SID}")


def test_not_running_in_time_raises_and_deletes(
    client: Client, rsps: responses.RequestsMock, clock: Clock
) -> None:
    add_create(rsps, state="Pending")
    rsps.get(f"{API}/sandboxes/{SID}", json=sandbox_body("Pending"))
    add_delete(rsps)
    with pytest.raises(SandboxTimeoutError, match=f"sandbox {SID} was not Running within 2.0"):
        client.create_sandbox(ready_timeout=2.0, poll_interval=0.5)
    assert clock.sleeps == [0.5] * 4
    assert calls(rsps)[-1] == ("DELETE", f"/v1/sandboxes/{SID}")


def test_404_while_polling_means_gone(
    client: Client, rsps: responses.RequestsMock, clock: Clock
) -> None:
    add_create(rsps, state="Pending")
    rsps.get(f"{API}/sandboxes/{SID}", status=404, json={"code": "X::NOT_FOUND", "message": "gone"})
    add_delete(rsps, status=404)
    with pytest.raises(NotFoundError, match="404 X::NOT_FOUND: gone"):
        client.create_sandbox()


# -- endpoint resolution ------------------------------------------------------------------


def test_endpoint_404_and_bad_bodies_are_retried(
    client: Client, ordered: responses.RequestsMock, clock: Clock
) -> None:
    add_create(ordered)
    add_endpoint(ordered, status=404, json={"code": "KUBERNETES::POD_IP_NOT_AVAILABLE"})
    add_endpoint(ordered, json={"headers": {}})
    add_endpoint(ordered, json={"endpoint": 12})
    add_endpoint(ordered, json=[1])
    add_endpoint(ordered, json={"endpoint": ENDPOINT})
    add_ping(ordered)
    sandbox = client.create_sandbox(poll_interval=0.1)
    assert clock.sleeps == [0.1] * 4
    assert sandbox.execd_headers == {}
    q = parse_qs(urlsplit(ordered.calls[1].request.url).query)
    assert q == {"use_server_proxy": ["false"]}


def test_endpoint_never_ready_times_out_chained_and_deletes(
    client: Client, rsps: responses.RequestsMock, clock: Clock
) -> None:
    add_create(rsps)
    add_endpoint(rsps, status=404, json={"code": "NF", "message": "no ip"})
    add_delete(rsps)
    with pytest.raises(SandboxTimeoutError, match=f"execd endpoint for {SID} was not ready") as e:
        client.create_sandbox(ready_timeout=1.0, poll_interval=0.25)
    assert isinstance(e.value.__cause__, NotFoundError)
    assert calls(rsps)[-1] == ("DELETE", f"/v1/sandboxes/{SID}")


def test_endpoint_other_error_raises_at_once(
    client: Client, rsps: responses.RequestsMock, clock: Clock
) -> None:
    add_create(rsps)
    add_endpoint(rsps, status=403, json={"code": "FORBIDDEN", "message": "no"})
    add_delete(rsps)
    with pytest.raises(ApiError, match="403 FORBIDDEN") as info:
        client.create_sandbox()
    assert info.value.status_code == 403 and not isinstance(info.value, NotFoundError)
    assert clock.sleeps == []


def test_connect_resolves_endpoint_and_does_not_own(
    client: Client, rsps: responses.RequestsMock
) -> None:
    add_endpoint(rsps)
    with client.connect(SID) as sandbox:
        assert sandbox.execd_url == f"http://{ENDPOINT}"
    assert calls(rsps) == [
        ("GET", f"/v1/sandboxes/{SID}/endpoints/44772"),
        ("GET", "/proxy/44772/ping"),
    ]
    assert rsps.calls[1].request.headers["X-EXECD-ACCESS-TOKEN"] == TOKEN


def test_connect_without_health_check(client: Client, rsps: responses.RequestsMock) -> None:
    add_endpoint(rsps)
    client.connect(SID, health_check=False)
    assert calls(rsps) == [("GET", f"/v1/sandboxes/{SID}/endpoints/44772")]


def test_health_check_polls_ping_until_ready(
    client: Client, ordered: responses.RequestsMock, clock: Clock
) -> None:
    add_endpoint(ordered)
    add_ping(ordered, status=502)
    ordered.get(f"{API}/sandboxes/{SID}", json=sandbox_body("Running"))  # after a failed ping
    add_ping(ordered, body=requests.ConnectionError("refused"))
    ordered.get(f"{API}/sandboxes/{SID}", json=sandbox_body("Running"))
    add_ping(ordered)
    client.connect(SID, poll_interval=0.3, ready_timeout=5)
    assert clock.sleeps == [0.3, 0.3]


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("Paused", rf"sandbox {SID} is Paused .*: resume it first"),
        ("Failed", rf"sandbox {SID} entered Failed \(ExitedNonZero: exited with code 7\)"),
        ("Terminated", rf"sandbox {SID} entered Terminated"),
    ],
)
def test_health_check_ends_at_once_in_a_state_execd_cannot_answer_in(
    client: Client, ordered: responses.RequestsMock, clock: Clock, state: str, expected: str
) -> None:
    add_endpoint(ordered)
    add_ping(ordered, status=502)
    body = sandbox_body(state)
    body["status"].update(reason="ExitedNonZero", message="exited with code 7")
    ordered.get(f"{API}/sandboxes/{SID}", json=body)
    with pytest.raises(SandboxStateError, match=expected):
        client.connect(SID, poll_interval=0.3, ready_timeout=30)
    assert clock.sleeps == []


def test_health_check_goes_on_when_the_state_cannot_be_read(
    client: Client, ordered: responses.RequestsMock, clock: Clock
) -> None:
    add_endpoint(ordered)
    add_ping(ordered, status=502)
    ordered.get(f"{API}/sandboxes/{SID}", status=403, json={"code": "NO", "message": "no"})
    add_ping(ordered)
    client.connect(SID, poll_interval=0.3, ready_timeout=5)
    assert clock.sleeps == [0.3]


def test_health_check_times_out_and_create_deletes(
    client: Client, rsps: responses.RequestsMock, clock: Clock
) -> None:
    rsps.replace(responses.GET, "http://execd.test:9000/proxy/44772/ping", status=502)
    add_create(rsps)
    add_endpoint(rsps)
    add_delete(rsps)
    with pytest.raises(SandboxTimeoutError, match=r"did not answer /ping within 1\.0"):
        client.create_sandbox(ready_timeout=1.0, poll_interval=0.5)
    assert calls(rsps)[-1] == ("DELETE", f"/v1/sandboxes/{SID}")


def test_health_check_stops_when_the_sandbox_is_gone(
    client: Client, ordered: responses.RequestsMock, clock: Clock
) -> None:
    add_endpoint(ordered)
    gone = {"code": "DOCKER::SANDBOX_NOT_FOUND", "message": f"Sandbox {SID} not found."}
    add_ping(ordered, status=404, json=gone)
    ordered.get(f"{API}/sandboxes/{SID}", status=404, json=gone)
    with pytest.raises(NotFoundError, match="SANDBOX_NOT_FOUND"):
        client.connect(SID, poll_interval=0.3, ready_timeout=30)
    assert clock.sleeps == []


def test_health_check_waits_on_a_404_while_the_sandbox_exists(
    client: Client, ordered: responses.RequestsMock, clock: Clock
) -> None:
    add_endpoint(ordered)
    add_ping(ordered, status=404, json={"code": "NOT_FOUND", "message": "no route yet"})
    ordered.get(f"{API}/sandboxes/{SID}", json=sandbox_body("Running"))
    add_ping(ordered)
    client.connect(SID, poll_interval=0.3, ready_timeout=5)
    assert clock.sleeps == [0.3]


def test_sandbox_context_manager_deletes_what_it_created(
    client: Client, rsps: responses.RequestsMock
) -> None:
    add_create(rsps)
    add_endpoint(rsps)
    add_delete(rsps)
    with client.create_sandbox() as sandbox:
        assert sandbox.id == SID
    assert calls(rsps)[-1] == ("DELETE", f"/v1/sandboxes/{SID}")


# -- create failures never leak ---------------------------------------------------------------


def test_create_response_without_id_is_a_clear_error_that_does_not_echo(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.post(f"{API}/sandboxes", json={"status": {"state": "Running"}, "x": "SECRETBODY"})
    rsps.get(f"{API}/sandboxes", json={"items": [], "pagination": {}})
    with pytest.raises(ApiError, match="without an id") as info:
        client.create_sandbox()
    assert "SECRETBODY" not in str(info.value)


def test_create_response_not_an_object_is_a_clear_error(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.post(f"{API}/sandboxes", json=["SECRETBODY"])
    rsps.get(f"{API}/sandboxes", json={"items": []})
    with pytest.raises(ApiError, match="not a JSON object") as info:
        client.create_sandbox()
    assert "SECRETBODY" not in str(info.value)


@pytest.mark.parametrize(
    "failure",
    [
        {"status": 504, "json": {"code": "KUBERNETES::POD_READY_TIMEOUT", "message": "slow"}},
        {"body": requests.ReadTimeout("read timed out")},
    ],
)
def test_lost_create_is_found_by_tag_and_deleted(
    client: Client, rsps: responses.RequestsMock, failure: dict[str, Any]
) -> None:
    rsps.post(f"{API}/sandboxes", **failure)
    found: dict[str, Any] = {}

    def listing(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        query = parse_qs(urlsplit(request.url).query)
        found["filter"] = parse_qs(query["metadata"][0])
        tag = found["filter"][CREATE_ID_KEY][0]
        items = [
            {"id": "leaked", "metadata": {CREATE_ID_KEY: tag}},
            {"id": "other", "metadata": {CREATE_ID_KEY: "not-ours"}},
        ]
        import json

        return 200, {}, json.dumps({"items": items})

    rsps.add_callback("GET", f"{API}/sandboxes", callback=listing)
    add_delete(rsps, sid="leaked")
    with pytest.raises((ApiError, TransportError)):
        client.create_sandbox()
    create_tag = body_of(rsps.calls[0])["metadata"][CREATE_ID_KEY]
    assert found["filter"] == {CREATE_ID_KEY: [create_tag]}
    assert ("DELETE", "/v1/sandboxes/leaked") in calls(rsps)
    assert ("DELETE", "/v1/sandboxes/other") not in calls(rsps)


def test_create_4xx_does_not_look_for_leaks(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.post(f"{API}/sandboxes", status=422, json={"detail": [{"loc": ["body"], "msg": "bad"}]})
    with pytest.raises(ApiError, match="422 VALIDATION_ERROR: body: bad"):
        client.create_sandbox()
    assert calls(rsps) == [("POST", "/v1/sandboxes")]


def test_egress_400_gets_a_hint(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.post(
        f"{API}/sandboxes",
        status=400,
        json={"code": "SANDBOX::INVALID_PARAMETER", "message": "egress.image is not configured"},
        headers={"X-Request-ID": "rid-1"},
    )
    with pytest.raises(ApiError) as info:
        client.create_sandbox()
    text = str(info.value)
    assert "allow_internet_access=True" in text and "rid-1" in text
    assert info.value.code == "SANDBOX::INVALID_PARAMETER" and info.value.request_id == "rid-1"


def test_same_400_without_network_policy_has_no_hint(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.post(f"{API}/sandboxes", status=400, json={"code": "SANDBOX::INVALID_PARAMETER"})
    with pytest.raises(ApiError) as info:
        client.create_sandbox(allow_internet_access=True)
    assert "Hint" not in str(info.value)


# -- retries --------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_get_and_delete_retry_on_transient_statuses(
    client: Client, ordered: responses.RequestsMock, clock: Clock, status: int
) -> None:
    ordered.delete(f"{API}/sandboxes/{SID}", status=status)
    ordered.delete(f"{API}/sandboxes/{SID}", status=status, headers={"Retry-After": "3"})
    ordered.delete(f"{API}/sandboxes/{SID}", status=204)
    assert client.delete_sandbox(SID) is True
    assert clock.sleeps == [0.5, 3.0]


def test_retry_after_http_date_and_cap(
    client: Client, ordered: responses.RequestsMock, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.0)
    ordered.delete(
        f"{API}/sandboxes/{SID}",
        status=429,
        headers={"Retry-After": "Tue, 14 Nov 2023 22:13:30 GMT"},
    )
    ordered.delete(f"{API}/sandboxes/{SID}", status=503, headers={"Retry-After": "86400"})
    ordered.delete(f"{API}/sandboxes/{SID}", status=204)
    client.delete_sandbox(SID)
    assert clock.sleeps == [pytest.approx(10.0), 30.0]


def test_retries_stop_at_max_retries(
    client: Client, rsps: responses.RequestsMock, clock: Clock
) -> None:
    rsps.delete(f"{API}/sandboxes/{SID}", status=503, json={"code": "BUSY", "message": "later"})
    with pytest.raises(ApiError, match="503 BUSY"):
        client.delete_sandbox(SID)
    assert len(rsps.calls) == 3 and clock.sleeps == [0.5, 1.0]


def test_get_retries_connection_errors(
    client: Client, ordered: responses.RequestsMock, clock: Clock
) -> None:
    add_endpoint(ordered, body=requests.ConnectionError("reset"))
    add_endpoint(ordered)
    add_ping(ordered)
    assert client.connect(SID).execd_url == f"http://{ENDPOINT}"


def tls_failure(reason: ssl.SSLError) -> requests.exceptions.SSLError:
    """What requests raises for a failed handshake: the ssl error, wrapped as urllib3 does."""
    pool_error = urllib3.exceptions.MaxRetryError(
        None,
        "/",
        reason=urllib3.exceptions.SSLError(reason),
    )
    return requests.exceptions.SSLError(pool_error)


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        (
            ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] self-signed"),
            "TLS error",
        ),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "use http://"),
    ],
)
def test_a_permanent_tls_failure_is_not_retried(
    client: Client, rsps: responses.RequestsMock, clock: Clock, reason: ssl.SSLError, said: str
) -> None:
    add_endpoint(rsps, body=tls_failure(reason))
    with pytest.raises(TransportError, match=said):
        client.connect(SID)
    assert len(rsps.calls) == 1 and clock.sleeps == []


def test_a_tls_connection_cut_mid_handshake_is_retried(
    client: Client, ordered: responses.RequestsMock, clock: Clock
) -> None:
    eof = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    add_endpoint(ordered, body=tls_failure(eof))
    add_endpoint(ordered)
    add_ping(ordered)
    assert client.connect(SID).execd_url == f"http://{ENDPOINT}"
    assert clock.sleeps == [0.5]


# A 429 create is retried on purpose, with a fresh tag: tests/unit/test_kubernetes_faults.py
@pytest.mark.parametrize(
    "failure", [{"status": 503}, {"status": 403}, {"body": requests.ConnectionError("reset")}]
)
def test_create_post_is_never_retried_once_sent(
    client: Client, rsps: responses.RequestsMock, clock: Clock, failure: dict[str, Any]
) -> None:
    rsps.post(f"{API}/sandboxes", **failure)
    rsps.get(f"{API}/sandboxes", json={"items": []})
    with pytest.raises((ApiError, TransportError)):
        client.create_sandbox()
    assert calls(rsps).count(("POST", "/v1/sandboxes")) == 1


def test_run_post_is_never_retried(
    client: Client, rsps: responses.RequestsMock, clock: Clock
) -> None:
    add_endpoint(rsps)
    add_run(rsps, status=503)
    with pytest.raises(ApiError, match="503"):
        client.run_code(SID, "1")
    assert calls(rsps).count(("POST", "/proxy/44772/code")) == 1


# -- delete ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "expected"), [(204, True), (200, True), (404, False)])
def test_delete_result(
    client: Client, rsps: responses.RequestsMock, status: int, expected: bool
) -> None:
    add_delete(rsps, status=status)
    assert client.delete_sandbox(SID) is expected


def test_delete_other_error_raises(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.delete(f"{API}/sandboxes/{SID}", status=500, json={"code": "GENERAL::UNKNOWN_ERROR"})
    with pytest.raises(ApiError, match="DELETE /v1/sandboxes/sbx-1 -> 500 GENERAL::UNKNOWN_ERROR"):
        client.delete_sandbox(SID)


def test_ids_are_escaped_in_paths(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.delete(f"{API}/sandboxes/..%2Fx", status=204)
    assert client.delete_sandbox("../x") is True


# -- running code ---------------------------------------------------------------------------


def test_runs_by_id_reach_the_sandbox_once(client: Client, rsps: responses.RequestsMock) -> None:
    add_endpoint(rsps)
    add_run(rsps)
    client.run_code(SID, "1")
    client.run_code(SID, "2")
    assert calls(rsps) == [
        ("GET", f"/v1/sandboxes/{SID}/endpoints/44772"),
        ("GET", "/proxy/44772/ping"),
        ("POST", "/proxy/44772/code"),
        ("POST", "/proxy/44772/code"),
    ]


def test_a_failed_run_by_id_reaches_the_sandbox_afresh(
    client: Client, rsps: responses.RequestsMock
) -> None:
    add_endpoint(rsps)
    rsps.post("http://execd.test:9000/proxy/44772/code", status=502)
    with pytest.raises(ApiError):
        client.run_code(SID, "1")
    add_run(rsps)
    client.run_code(SID, "2")
    assert [path for _, path in calls(rsps)].count(f"/v1/sandboxes/{SID}/endpoints/44772") == 2


def test_handles_compare_and_hash_by_id(client: Client, rsps: responses.RequestsMock) -> None:
    add_endpoint(rsps)
    first, second = client.connect(SID), client.connect(SID)
    assert first is not second and first == second and len({first, second}) == 1
    assert first != osb_sync.Sandbox.from_execd(f"http://{ENDPOINT}")


def test_delete_quietly_logs_instead_of_raising(
    client: Client, rsps: responses.RequestsMock, caplog: pytest.LogCaptureFixture
) -> None:
    rsps.delete(f"{API}/sandboxes/{SID}", status=409, json={"code": "X", "message": "busy"})
    with caplog.at_level(logging.WARNING, logger="osb_sync"):
        assert client.delete_quietly(SID) is False
    assert f"could not delete sandbox {SID}" in caplog.text and "busy" in caplog.text


def test_run_code_request_shape_and_no_api_key_to_execd(
    client: Client, rsps: responses.RequestsMock
) -> None:
    add_endpoint(rsps)
    add_run(rsps)
    result = client.run_code(SID, "print(42)", language="python")
    assert result.stdout == "42\n" and result.execution_id == "ctx-1"
    assert calls(rsps) == [
        ("GET", f"/v1/sandboxes/{SID}/endpoints/44772"),
        ("GET", "/proxy/44772/ping"),
        ("POST", "/proxy/44772/code"),
    ]
    request = rsps.calls[2].request
    assert body_of(rsps.calls[2]) == {"code": "print(42)", "context": {"language": "python"}}
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["Accept"] == "text/event-stream"
    assert request.headers["Cache-Control"] == "no-cache"
    assert request.headers["Accept-Encoding"] == "identity"
    assert request.headers["X-EXECD-ACCESS-TOKEN"] == TOKEN
    assert "OPEN-SANDBOX-API-KEY" not in request.headers


def test_scheme_less_endpoint_takes_api_base_scheme(rsps: responses.RequestsMock) -> None:
    https_api = "https://osb.test/v1"
    rsps.get(f"{https_api}/sandboxes/{SID}/endpoints/44772", json={"endpoint": ENDPOINT})
    rsps.get("https://execd.test:9000/proxy/44772/ping")
    rsps.post(
        "https://execd.test:9000/proxy/44772/code", body=b"", content_type="text/event-stream"
    )
    Client(https_api).run_code(SID, "1")
    assert rsps.calls[-1].request.url == "https://execd.test:9000/proxy/44772/code"


def test_execd_scheme_overrides(rsps: responses.RequestsMock) -> None:
    https_api = "https://osb.test/v1"
    rsps.get(f"{https_api}/sandboxes/{SID}/endpoints/44772", json={"endpoint": ENDPOINT})
    add_run(rsps)
    Client(https_api, execd_scheme="http").run_code(SID, "1")
    assert rsps.calls[-1].request.url == "http://execd.test:9000/proxy/44772/code"


def test_sandbox_side_exception_is_returned_not_raised(
    client: Client, rsps: responses.RequestsMock
) -> None:
    add_endpoint(rsps)
    add_run(
        rsps,
        {"type": "init", "text": "ctx"},
        {"type": "status", "text": "error"},
        {
            "type": "error",
            "error": {
                "ename": "ZeroDivisionError",
                "evalue": "division by zero",
                "traceback": ["Traceback"],
            },
        },
        {"type": "execution_complete"},
    )
    result = client.run_code(SID, "1/0")
    assert result.error is not None and result.error.name == "ZeroDivisionError"


def test_on_event_sees_every_event_in_order(client: Client, rsps: responses.RequestsMock) -> None:
    add_endpoint(rsps)
    add_run(rsps)
    seen: list[str] = []
    client.run_code(SID, "1", on_event=lambda e: seen.append(e.type))
    assert seen == ["init", "stdout", "execution_complete"]


def test_output_cap_raises_and_interrupts(client: Client, rsps: responses.RequestsMock) -> None:
    add_endpoint(rsps)
    add_run(rsps, {"type": "init", "text": "ctx-9"}, {"type": "stdout", "text": "x" * 5000})
    rsps.delete("http://execd.test:9000/proxy/44772/code", status=200)
    with pytest.raises(OutputLimitExceeded, match="exceeded 1000 bytes") as info:
        client.run_code(SID, "flood", max_output_bytes=1000)
    assert isinstance(info.value, ValueError)
    interrupt = rsps.calls[-1].request
    assert (interrupt.method, parse_qs(urlsplit(interrupt.url).query)) == (
        "DELETE",
        {"id": ["ctx-9"]},
    )
    assert interrupt.headers["X-EXECD-ACCESS-TOKEN"] == TOKEN


@pytest.mark.parametrize(
    "bad",
    [
        {"code": 5},
        {"code": ""},
        {"code": " \n"},  # real execd never ends a blank run: the context stays busy for good
        {"language": ""},
        {"max_output_bytes": 0},
        {"timeout": -1},
    ],
)
def test_bad_run_arguments(client: Client, bad: dict[str, Any]) -> None:
    sandbox = osb_sync.Sandbox.from_execd(f"http://{ENDPOINT}")
    kwargs: dict[str, Any] = {"code": "1", **bad}
    code = kwargs.pop("code")
    with pytest.raises(ConfigurationError):
        sandbox.run_code(code, **kwargs)


def test_execd_error_status_goes_through_the_funnel(
    client: Client, rsps: responses.RequestsMock
) -> None:
    add_endpoint(rsps)
    rsps.post(
        "http://execd.test:9000/proxy/44772/code",
        status=401,
        json={"error": f"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN {TOKEN}"},
    )
    with pytest.raises(ApiError, match="POST /proxy/44772/code -> 401: Unauthorized") as info:
        client.run_code(SID, "1")
    assert TOKEN not in str(info.value)


# -- the ephemeral tool ----------------------------------------------------------------------


def test_tool_deletes_even_when_the_run_raises(
    client: Client, rsps: responses.RequestsMock
) -> None:
    add_create(rsps)
    add_endpoint(rsps)
    add_run(rsps, status=500, json={"code": "RUNTIME_ERROR", "message": "no kernel"})
    add_delete(rsps)
    with pytest.raises(ApiError, match="no kernel"):
        client.code_interpreter_tool("1", timeout=120, run_timeout=5)
    assert calls(rsps) == [
        ("POST", "/v1/sandboxes"),
        ("GET", f"/v1/sandboxes/{SID}/endpoints/44772"),
        ("GET", "/proxy/44772/ping"),
        ("POST", "/proxy/44772/code"),
        ("DELETE", f"/v1/sandboxes/{SID}"),
    ]
    assert body_of(rsps.calls[0])["timeout"] == 120


def test_tool_failed_delete_is_logged_and_does_not_mask(
    client: Client, rsps: responses.RequestsMock, caplog: pytest.LogCaptureFixture, clock: Clock
) -> None:
    add_create(rsps)
    add_endpoint(rsps)
    add_run(rsps)
    add_delete(rsps, status=500)
    with caplog.at_level(logging.WARNING, logger="osb_sync"):
        result = client.code_interpreter_tool("print(42)")
    assert result.stdout == "42\n"
    assert "could not delete sandbox sbx-1" in caplog.text


# -- module-level functions -------------------------------------------------------------------


def test_module_functions_round_trip(rsps: responses.RequestsMock) -> None:
    add_create(rsps)
    add_endpoint(rsps)
    add_run(rsps)
    add_delete(rsps)
    sandbox = osb_sync.create_sandbox(api_base=API, api_key=KEY)
    assert osb_sync.run_code(sandbox, "print(42)").stdout == "42\n"
    assert osb_sync.delete_sandbox(sandbox) is True
    assert rsps.calls[-1].request.headers["OPEN-SANDBOX-API-KEY"] == KEY


def test_module_functions_with_bare_id(rsps: responses.RequestsMock) -> None:
    add_endpoint(rsps)
    add_run(rsps)
    add_delete(rsps, status=404)
    assert osb_sync.run_code(SID, "1", api_base=API, api_key=KEY).stdout == "42\n"
    assert osb_sync.delete_sandbox(SID, api_base=API) is False


def test_module_tool(rsps: responses.RequestsMock) -> None:
    add_create(rsps)
    add_endpoint(rsps)
    add_run(rsps)
    add_delete(rsps)
    assert osb_sync.code_interpreter_tool("1", api_base=API).to_dict()["stdout"] == "42\n"
    assert calls(rsps)[-1] == ("DELETE", f"/v1/sandboxes/{SID}")


# -- logging ----------------------------------------------------------------------------------


def test_one_debug_line_per_call_without_secrets(
    client: Client, rsps: responses.RequestsMock, caplog: pytest.LogCaptureFixture
) -> None:
    add_endpoint(rsps)
    add_run(rsps)
    with caplog.at_level(logging.DEBUG, logger="osb_sync"):
        client.run_code(SID, "1")
    lines = [r.getMessage() for r in caplog.records if r.name == "osb_sync"]
    assert lines[0].startswith(f"GET /v1/sandboxes/{SID}/endpoints/44772 -> 200 in ")
    assert lines[1].startswith("GET /proxy/44772/ping -> 200 in ")
    assert lines[2].startswith("POST /proxy/44772/code -> 200 in ")
    assert len(lines) == 3
    assert all(KEY not in line and TOKEN not in line for line in lines)


# -- describing and listing -------------------------------------------------------------------


def test_get_sandbox_parses_the_description(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.get(
        f"{API}/sandboxes/{SID}",
        json={
            "id": SID,
            "status": {"state": "Running", "reason": "CONTAINER_RUNNING", "message": "ok"},
            "metadata": {"team": "ml"},
            "image": {"uri": "img:1"},
            "entrypoint": ["/bin/run"],
            "createdAt": "2026-06-12T10:00:00.123456789Z",
        },
    )
    info = client.get_sandbox(SID)
    assert (info.id, info.state, info.reason, info.message) == (
        SID,
        "Running",
        "CONTAINER_RUNNING",
        "ok",
    )
    assert (info.metadata, info.image, info.entrypoint) == ({"team": "ml"}, "img:1", ["/bin/run"])
    assert info.created_at is not None and info.created_at.isoformat() == (
        "2026-06-12T10:00:00.123456+00:00"
    )
    assert info.expires_at is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-06-12T10:00:00Z", "2026-06-12T10:00:00+00:00"),
        ("2026-06-12T10:00:00.5+02:00", "2026-06-12T10:00:00.500000+02:00"),
        ("2026-06-12T10:00:00", "2026-06-12T10:00:00+00:00"),
        ("yesterday", None),
        (None, None),
    ],
)
def test_sandbox_times_are_parsed(text: Any, expected: str | None) -> None:
    parsed = osb_sync.SandboxInfo.from_dict({"id": SID, "expiresAt": text}).expires_at
    assert (parsed.isoformat() if parsed else None) == expected


def test_list_sandboxes_follows_pages_lazily_with_filters(
    client: Client, ordered: responses.RequestsMock
) -> None:
    ordered.get(
        f"{API}/sandboxes",
        json={"items": [{"id": "a"}, {"id": "b"}], "pagination": {"hasNextPage": True}},
    )
    ordered.get(f"{API}/sandboxes", json={"items": [{"id": "c"}], "pagination": {}})
    listing = client.list_sandboxes(
        states=["Running", "Paused"], metadata={"team": "ml", "k": "a&b"}, page_size=2
    )
    assert next(listing).id == "a"
    assert len(ordered.calls) == 1
    assert [s.id for s in listing] == ["b", "c"]
    first = parse_qs(urlsplit(ordered.calls[0].request.url).query)
    assert first["state"] == ["Running", "Paused"]
    assert parse_qs(first["metadata"][0]) == {"team": ["ml"], "k": ["a&b"]}
    assert (first["page"], first["pageSize"]) == (["1"], ["2"])
    assert parse_qs(urlsplit(ordered.calls[1].request.url).query)["page"] == ["2"]


def test_list_page_size_is_checked(client: Client) -> None:
    with pytest.raises(ConfigurationError, match="page_size"):
        list(client.list_sandboxes(page_size=201))


def test_registry_password_never_appears_in_errors(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.post(
        f"{API}/sandboxes",
        status=400,
        json={"code": "DOCKER::SANDBOX_IMAGE_PULL_FAILED", "message": "auth hunter2-pw refused"},
    )
    with pytest.raises(ApiError) as info:
        client.create_sandbox(image_auth={"username": "me", "password": "hunter2-pw"})
    assert "hunter2-pw" not in str(info.value) and "hunter2-pw" not in info.value.message


def test_connect_to_an_unknown_sandbox_fails_at_once(
    client: Client, rsps: responses.RequestsMock, clock: Clock
) -> None:
    add_endpoint(
        rsps,
        status=404,
        json={"code": "DOCKER::SANDBOX_NOT_FOUND", "message": f"Sandbox {SID} not found."},
    )
    with pytest.raises(NotFoundError, match="SANDBOX_NOT_FOUND"):
        client.connect(SID)
    assert clock.sleeps == []


def test_a_sandbox_description_that_is_not_an_object_is_an_api_error(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.get(f"{API}/sandboxes/{SID}", json=["not", "a", "sandbox"])
    with pytest.raises(ApiError, match="not a JSON object") as info:
        client.get_sandbox(SID)
    assert not isinstance(info.value, ConfigurationError)


@pytest.mark.parametrize(
    ("method", "url", "body", "content_type", "call"),
    [
        ("GET", f"{API}/sandboxes/{SID}", b"[]", "application/json",
         lambda c: c.get_sandbox(SID)),
        ("POST", f"{API}/sandboxes", b"{}", "application/json",
         lambda c: c.create_sandbox()),
        ("POST", "http://execd.test:9000/proxy/44772/code", b"<html></html>", "text/html",
         lambda c: c.run_code(SID, "1")),
    ],
)  # fmt: skip
def test_unusable_answers_are_invalid_response_with_their_request_id(
    client: Client,
    rsps: responses.RequestsMock,
    method: str,
    url: str,
    body: bytes,
    content_type: str,
    call: Any,
) -> None:
    add_endpoint(rsps)
    rsps.get(f"{API}/sandboxes", json={"items": []})
    rsps.add(method, url, body=body, content_type=content_type, headers={"X-Request-ID": "r-7"})
    with pytest.raises(ApiError) as info:
        call(client)
    assert info.value.code == "INVALID_RESPONSE" and info.value.request_id == "r-7"
    assert str(info.value).startswith(f"{method} /") and "(request id r-7)" in str(info.value)


# -- sandbox stats (osb-sync serve's extension) ------------------------------------------------


def test_sandbox_stats_reads_the_extension_and_keeps_no_bad_figure(
    rsps: responses.RequestsMock, client: Client
) -> None:
    figures = {"memoryUsedBytes": 5 << 20, "memoryLimitBytes": 256 << 20, "cpuLimit": 0.5}
    bad = {"cpuSeconds": float("nan"), "pids": True, "pidsLimit": -1}
    given = {"id": "sb1", "resourceLimits": {"memory": "256Mi"}, "source": "cgroup"}
    rsps.get(f"{API}/sandboxes/sb1/stats", json={**given, **figures, **bad})
    stats = client.sandbox_stats("sb1")
    assert (stats.memory_limit_bytes, stats.cpu_limit, stats.source) == (256 << 20, 0.5, "cgroup")
    assert stats.resource_limits == {"memory": "256Mi"}
    assert (stats.cpu_seconds, stats.pids, stats.pids_limit) == (None, None, None)


def test_sandbox_stats_keeps_no_figure_too_large_for_a_float(
    rsps: responses.RequestsMock, client: Client
) -> None:
    """A figure of 400 digits (valid JSON) raised OverflowError in from_dict (cpuLimit) or,
    in osb-sync stats, when shown in MiB; a limit of 400 digits became inf, which --json
    printed as Infinity (not JSON)."""
    huge = 10**400
    figures = {"memoryUsedBytes": huge, "memoryLimitBytes": 1 << 63, "cpuLimit": huge}
    rsps.get(f"{API}/sandboxes/sb1/stats", json={"id": "sb1", "source": "cgroup", **figures})
    stats = client.sandbox_stats("sb1")
    assert (stats.memory_used_bytes, stats.memory_limit_bytes, stats.cpu_limit) == (None,) * 3
    assert _cli_sandboxes.quantity("9" * 400 + "Mi") is None
    assert _cli_sandboxes.quantity("256Mi") == 256 << 20


def test_sandbox_stats_of_a_server_without_the_extension_is_not_supported(
    rsps: responses.RequestsMock, client: Client
) -> None:
    rsps.get(f"{API}/sandboxes/sb1/stats", status=404, json={"detail": "Not Found"})
    rsps.get(API.removesuffix("/v1") + "/version", json={"version": "1.1.1"})
    with pytest.raises(osb_sync.NotSupportedError, match=r"metrics\(\) gives execd's figures"):
        client.sandbox_stats("sb1")
