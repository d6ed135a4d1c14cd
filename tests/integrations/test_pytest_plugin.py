"""The pytest plugin (osb_sync.testing), run in inner pytest sessions with pytester."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points

import pytest

from osb_sync import Client
from osb_sync.local import LocalServer

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def remote() -> Iterator[LocalServer]:
    """Stands in for a real deployment reached with --opensandbox-api-base."""
    with LocalServer(unenforced_network_policy="accept") as srv:
        yield srv


def inner_pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An inner session in this process, without hypothesis's plugin.

    pytester drops the modules an inner session imported: hypothesis's plugin would import
    hypothesis anew at the end of every session (about a second of CPU each).
    """
    return pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args)


def test_the_plugin_is_registered_for_pytest() -> None:
    (ep,) = [e for e in entry_points(group="pytest11") if e.name == "opensandbox"]
    assert ep.value == "osb_sync.testing"


def test_importing_the_plugin_starts_nothing() -> None:
    code = (
        "import sys, threading, os\n"
        "env = dict(os.environ)\n"
        "import osb_sync.testing\n"
        "assert 'osb_sync.local' not in sys.modules\n"
        "assert threading.active_count() == 1\n"
        "assert dict(os.environ) == env\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sandbox_and_client_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        from osb_sync import NotFoundError

        seen = []

        def test_sandbox_runs_code(opensandbox_sandbox, opensandbox_server):
            assert opensandbox_server.local is not None
            assert opensandbox_sandbox.run_code("print(6 * 7)").stdout == "42\\n"
            seen.append(opensandbox_sandbox.id)

        def test_it_was_deleted_afterwards(opensandbox_client):
            with pytest.raises(NotFoundError):
                opensandbox_client.get_sandbox(seen[0])

        def test_client_creates_and_deletes(opensandbox_client):
            with opensandbox_client.create_sandbox() as sandbox:
                assert sandbox.commands.run("echo hi").stdout == "hi\\n"
        """
    )
    result = inner_pytest(pytester)
    result.assert_outcomes(passed=3)


def test_create_kwargs_can_be_overridden(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def opensandbox_create_kwargs():
            return {"env_vars": {"GREETING": "hello"}, "metadata": {"team": "qa"}}
        """
    )
    pytester.makepyfile(
        """
        def test_env(opensandbox_sandbox):
            assert opensandbox_sandbox.commands.run("echo $GREETING").stdout == "hello\\n"
            assert opensandbox_sandbox.info().metadata["team"] == "qa"
        """
    )
    inner_pytest(pytester).assert_outcomes(passed=1)


def test_a_sandbox_left_by_the_test_through_the_client_errors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_leaks(opensandbox_client):
            opensandbox_client.create_sandbox()

        def test_next_one_is_fine(opensandbox_client):
            pass
        """
    )
    result = inner_pytest(pytester)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaks*", "*left 1 sandbox(es) alive*"])


def test_a_sandbox_left_at_the_end_of_the_session_fails_the_run(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        from osb_sync import Client

        def test_app_code_leaks(opensandbox_server):
            # the code under test builds its own client: only the session check sees it
            Client(opensandbox_server.api_base).create_sandbox()
        """
    )
    result = inner_pytest(pytester)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*left alive at the end of the test session*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_api_base_option_uses_that_server(pytester: pytest.Pytester, remote: LocalServer) -> None:
    pytester.makepyfile(
        """
        from osb_sync import Client

        def test_remote(opensandbox_server, opensandbox_sandbox):
            assert opensandbox_server.local is None
            with Client(opensandbox_server.api_base) as remote:
                assert remote.get_sandbox(opensandbox_sandbox.id).state == "Running"
            assert opensandbox_sandbox.run_code("1 + 1").results == [{"text": "2"}]

        def test_leak(opensandbox_client):
            opensandbox_client.create_sandbox()
        """
    )
    result = inner_pytest(pytester, f"--opensandbox-api-base={remote.api_base}")
    result.assert_outcomes(passed=2, errors=1)
    with Client(remote.api_base) as client:
        assert list(client.list_sandboxes()) == []


def test_unrelated_sandboxes_of_a_real_deployment_are_left_alone(
    pytester: pytest.Pytester, remote: LocalServer
) -> None:
    with Client(remote.api_base) as client, client.create_sandbox() as someone_elses:
        pytester.makepyfile("def test_nothing(opensandbox_server):\n    pass\n")
        result = inner_pytest(pytester, f"--opensandbox-api-base={remote.api_base}")
        result.assert_outcomes(passed=1)
        assert client.get_sandbox(someone_elses.id).state == "Running"
