"""What each ``osb-sync`` verb is given, and how a verb fails.

``_cli`` parses the command line; ``_cli._dispatch`` builds the verb's options here, once, from
argparse's namespace (``VERBS[verb].options.of(args)``), and calls the verb's handler with the
options every verb takes (:class:`GlobalOptions`) and its own: no handler sees the namespace,
and none asks which verb called it. A ``KEY=VALUE`` flag is a dict by then, and a bad one is a
:class:`UsageError` naming the flag.

The handlers live by idea, each module loaded on first use: ``_cli_run`` (run, serve and the
embedded server), ``_cli_sandboxes`` (the sandbox verbs), ``_cli_exec`` (exec and logs),
``_cli_copy`` (cp), ``_cli_images`` (images and pull); help and completion are ``_cli``'s.

Like ``_cli``, this module imports only the standard library and the light modules:
``--version``, ``--help`` and usage errors load neither requests nor the client.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ._constants import API_BASE_ENV, DOMAIN_ENV
from .local.host import options as server_options

if TYPE_CHECKING:
    from ._client import Client

SERVER_HINT = f"pass --api-base or set {API_BASE_ENV} (start a server with: osb-sync serve)"
OptionsT = TypeVar("OptionsT", bound="Options")
# run's flags of the embedded server (its other LocalServer keywords are run's own choice)
RUN_STORE_KEYWORDS = ("image_store", "registry_auth_file", "local_image_paths")


class UsageError(Exception):
    """Bad command-line input (exit 125)."""


class RunTimedOut(Exception):
    """The run passed its --timeout (exit 124)."""


class NoSuchSandbox(Exception):
    """No sandbox has this id, nor one alone an id that starts with it (exit 1)."""


class CannotRun(Exception):
    """The command could not be started as asked (exec -w of no directory): exit 126, as
    ``docker exec``."""


class Refused(Exception):
    """What a sandbox answered is refused (exit 1): ``cp`` out of it, an entry that would land
    outside DEST; or what ``cp`` cannot send it (a name that is not UTF-8)."""


class Stopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, unwinding as Ctrl-C does: the signal (for the exit status 128+n) and
    what the verb says of what it left (``note``)."""

    def __init__(self, signum: int, note: str = ""):
        super().__init__(signum)
        self.signum = signum
        self.note = note


class Options:
    """A verb's options: a frozen dataclass whose fields are named as argparse's destinations."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # each subclass is a dataclass

    @classmethod
    def of(cls: type[OptionsT], args: argparse.Namespace) -> OptionsT:
        """The options ``args`` holds for this verb.

        Raises:
            UsageError: a flag's value is unusable (a ``KEY=VALUE`` without ``=``).
        """
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: getattr(args, name) for name in names})


@dataclass(frozen=True)
class GlobalOptions(Options):
    """The options every verb takes, before or after its name."""

    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)  # a secret: never in a repr
    json: bool = False
    verbose: bool = False
    debug: bool = False

    def remote_configured(self) -> bool:
        """Whether the command line or the environment names a server."""
        return bool(self.api_base or os.environ.get(API_BASE_ENV) or os.environ.get(DOMAIN_ENV))

    def client(self) -> Client:
        """A client of the server the command line or the environment names.

        Raises:
            UsageError: none is named.
        """
        if not self.remote_configured():
            raise UsageError(f"this command needs a server: {SERVER_HINT}")
        from ._client import Client

        return Client(self.api_base, self.api_key)


def pairs(items: list[str], option: str) -> dict[str, str] | None:
    """``KEY=VALUE`` items as a dict (None for none).

    Raises:
        UsageError: an item without ``=`` or a key, naming ``option``.
    """
    found = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, got {item!r}")
        found[key] = value
    return found or None


@dataclass(frozen=True)
class RunOptions(Options):
    """``store``: the embedded server's image keywords (``--image-store``,
    ``--registry-auth-file``, ``--allow-image-path``)."""

    code: str | None
    file: str | None
    language: str
    keep: bool
    rm: bool
    timeout: float | None
    template: str | None
    allow_internet: bool
    max_output: int
    no_isolation: bool
    store: StoreOptions
    interactive: bool = False
    tty: bool = False

    @classmethod
    def of(cls, args: argparse.Namespace) -> RunOptions:
        names = [f.name for f in dataclasses.fields(cls) if f.name != "store"]
        embedded = StoreOptions.of(args).keywords
        store = StoreOptions({k: v for k, v in embedded.items() if k in RUN_STORE_KEYWORDS})
        return cls(**{name: getattr(args, name) for name in names}, store=store)


@dataclass(frozen=True)
class ServeOptions(Options):
    """``server``: LocalServer's keywords from the flags, but its ``api_key`` (read from
    ``api_key_file`` or the environment when the server starts)."""

    server: dict[str, Any]
    api_key_file: str | None

    @classmethod
    def of(cls, args: argparse.Namespace) -> ServeOptions:
        return cls(server_options.keywords(args, api_key=None), args.api_key_file)


@dataclass(frozen=True)
class NewSandboxOptions(Options):
    template: str | None
    lifetime: int
    metadata: dict[str, str] | None
    env: dict[str, str] | None
    allow_internet: bool
    allow: tuple[str, ...] = ()  # --allow: the only hosts it reaches, by name

    @classmethod
    def of(cls, args: argparse.Namespace) -> NewSandboxOptions:
        metadata = pairs(args.metadata, "--metadata")
        if args.name is not None:  # sandboxes have no names: --name is the label name=NAME
            if metadata and metadata.get("name", args.name) != args.name:
                raise UsageError("--name NAME is the label name=NAME: give one of them")
            metadata = {**(metadata or {}), "name": args.name}
        allow = tuple(args.allow)
        if allow and args.allow_internet:
            raise UsageError(
                "--allow names the only hosts the sandbox reaches, --allow-internet gives it"
                " every host: give one of them"
            )
        return cls(
            args.template,
            args.lifetime,
            metadata,
            pairs(args.env, "--env"),
            args.allow_internet,
            allow,
        )

    def network_policy(self) -> dict[str, Any] | None:
        """The create's networkPolicy for ``--allow`` (deny by default), else None."""
        if not self.allow:
            return None
        rules = [{"action": "allow", "target": target} for target in self.allow]
        return {"defaultAction": "deny", "egress": rules}


@dataclass(frozen=True)
class ListOptions(Options):
    state: list[str]
    metadata: dict[str, str] | None
    quiet: bool

    @classmethod
    def of(cls, args: argparse.Namespace) -> ListOptions:
        return cls(args.state, pairs(args.metadata, "--metadata"), args.quiet)


@dataclass(frozen=True)
class IdsOptions(Options):
    """The sandboxes a verb acts on (get, inspect, pause, resume, stats)."""

    ids: list[str]


@dataclass(frozen=True)
class DeleteOptions(Options):
    """``yes``: --all without asking; ``force`` (docker's ``rm -f``) changes nothing."""

    ids: list[str]
    all: bool
    metadata: dict[str, str] | None
    yes: bool = False

    @classmethod
    def of(cls, args: argparse.Namespace) -> DeleteOptions:
        return cls(args.ids, args.all, pairs(args.metadata, "--metadata"), args.yes)


@dataclass(frozen=True)
class RenewOptions(Options):
    ids: list[str]
    lifetime: int


@dataclass(frozen=True)
class OutputOptions(Options):
    """How a run's or a command's output is bounded and waited for."""

    timeout: float | None
    max_output: int


@dataclass(frozen=True)
class ExecOptions(Options):
    id: str
    cmd: list[str]
    interactive: bool
    tty: bool
    detach: bool
    env: dict[str, str] | None
    workdir: str | None
    user: str | None
    output: OutputOptions

    @classmethod
    def of(cls, args: argparse.Namespace) -> ExecOptions:
        return cls(
            args.id,
            args.cmd,
            args.interactive,
            args.tty,
            args.detach,
            pairs(args.env, "--env"),
            args.workdir,
            args.user,
            OutputOptions.of(args),
        )


@dataclass(frozen=True)
class LogsOptions(Options):
    id: str
    command_id: str | None
    follow: bool
    tail: int | None


@dataclass(frozen=True)
class CopyOptions(Options):
    src: str
    dest: str


@dataclass(frozen=True)
class StoreOptions(Options):
    """The image store's LocalServer keywords, from the flags an image verb has."""

    keywords: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, args: argparse.Namespace) -> StoreOptions:
        found = {}
        for option in server_options.OPTIONS:
            if option.flag and option.from_flag is not None and hasattr(args, option.dest):
                found[option.name] = option.from_flag(getattr(args, option.dest))
        return cls(found)


@dataclass(frozen=True)
class ImagesOptions(Options):
    images_action: str | None
    store: StoreOptions

    @classmethod
    def of(cls, args: argparse.Namespace) -> ImagesOptions:
        return cls(args.images_action, StoreOptions.of(args))


@dataclass(frozen=True)
class PullOptions(Options):
    image: str
    platform: str | None
    store: StoreOptions

    @classmethod
    def of(cls, args: argparse.Namespace) -> PullOptions:
        return cls(args.image, args.platform, StoreOptions.of(args))


@dataclass(frozen=True)
class HelpOptions(Options):
    topic: str | None


@dataclass(frozen=True)
class CompletionOptions(Options):
    shell: str


@dataclass(frozen=True)
class Verb:
    """Where a verb's handler is, and what it is given.

    Attributes:
        module: the module of its handler (imported on first use).
        handler: ``handler(GlobalOptions, options) -> exit status``.
        options: the type of its own options.
        runs: it runs something (run, exec): a sandbox not found is its own failure (125, as
            ``docker run``), not a "not found" (1).
    """

    module: str
    handler: str
    options: type[Options]
    runs: bool = False


VERBS = {
    "run": Verb("_cli_run", "cmd_run", RunOptions, runs=True),
    "serve": Verb("_cli_run", "cmd_serve", ServeOptions),
    "create": Verb("_cli_sandboxes", "cmd_create", NewSandboxOptions),
    "list": Verb("_cli_sandboxes", "cmd_list", ListOptions),
    "get": Verb("_cli_sandboxes", "cmd_get", IdsOptions),
    "inspect": Verb("_cli_sandboxes", "cmd_inspect", IdsOptions),
    "delete": Verb("_cli_sandboxes", "cmd_delete", DeleteOptions),
    "pause": Verb("_cli_sandboxes", "cmd_pause", IdsOptions),
    "resume": Verb("_cli_sandboxes", "cmd_resume", IdsOptions),
    "renew": Verb("_cli_sandboxes", "cmd_renew", RenewOptions),
    "stats": Verb("_cli_sandboxes", "cmd_stats", IdsOptions),
    "exec": Verb("_cli_exec", "cmd_exec", ExecOptions, runs=True),
    "logs": Verb("_cli_exec", "cmd_logs", LogsOptions),
    "cp": Verb("_cli_copy", "cmd_cp", CopyOptions),
    "images": Verb("_cli_images", "cmd_images", ImagesOptions),
    "pull": Verb("_cli_images", "cmd_pull", PullOptions),
    "help": Verb("_cli", "cmd_help", HelpOptions),
    "completion": Verb("_cli", "cmd_completion", CompletionOptions),
}
