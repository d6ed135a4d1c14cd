"""The sandbox verbs of ``osb-sync``: create, list, get, inspect, delete, pause, resume, renew
and stats, each against the server the command line or the environment names.

A sandbox is named by its id or, as docker does, by a prefix that only its id starts with
(:func:`resolve_id`): an id that exists is taken as it is, even when it also starts another;
an empty id, or a prefix that several ids start with, is refused naming them.

A verb given several ids acts on each, prints one line (or, with ``--json``, one object) per
id, and exits 1 when one was not found, as ``docker inspect`` does; a 404 about the route
itself (a wrong API base) is osb-sync's own failure, 125.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, Callable

from ._cli_options import (
    DeleteOptions,
    GlobalOptions,
    IdsOptions,
    ListOptions,
    NewSandboxOptions,
    NoSuchSandbox,
    RenewOptions,
    UsageError,
)
from ._cli_output import (
    EXIT_NOT_FOUND,
    names_missing_thing,
    print_status,
    print_table,
    progress,
    sandbox_json,
    sandbox_row,
)
from ._client import Client
from ._errors import ApiError, NotFoundError, NotSupportedError, with_suffix
from ._models import SandboxInfo, SandboxStats

# What a missing sandbox's message adds: the commonest reason, and what to do about it.
MAY_HAVE_EXPIRED = (
    "sandboxes expire; this one may have (create --lifetime SECONDS sets how long, renew "
    "pushes it back)"
)
AMBIGUOUS_SHOWN = 5  # ids named in an ambiguous prefix's message


class AmbiguousId(NoSuchSandbox):
    """A prefix that several sandboxes' ids start with (exit 1)."""


def resolve_id(client: Client, given: str, missing_ok: bool = False) -> str:
    """The id of the sandbox ``given`` names: its whole id, or a prefix of one id alone.

    Args:
        missing_ok: return ``given`` when nothing matches (the caller reports it per id).

    Raises:
        UsageError: ``given`` is empty.
        AmbiguousId: several ids start with ``given`` (none is ``given`` itself).
        NoSuchSandbox: nothing matches (unless ``missing_ok``).
    """
    if not given.strip():
        raise UsageError("an empty sandbox id: give an id or the start of one")
    try:
        if _info_or_none(client, given, quiet=True) is not None:
            return given
    except NotFoundError:  # a server without the route (execd alone): ids as they are
        return given
    matches = sorted(info.id for info in client.list_sandboxes() if info.id.startswith(given))
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(matches[:AMBIGUOUS_SHOWN])
        more = (
            f" and {len(matches) - AMBIGUOUS_SHOWN} more" if len(matches) > AMBIGUOUS_SHOWN else ""
        )
        raise AmbiguousId(
            f"sandbox id {given!r} is ambiguous: {len(matches)} sandboxes' ids start with "
            f"it ({shown}{more}); give more of the id"
        )
    if missing_ok:
        return given
    raise NoSuchSandbox(f"no sandbox {given} (nor one whose id starts so): {MAY_HAVE_EXPIRED}")


def resolve_ids(client: Client, given: list[str]) -> list[str]:
    """Each of ``given`` resolved (:func:`resolve_id`); what matches nothing is kept as it is,
    for the verb to report as not found."""
    return [resolve_id(client, text, missing_ok=True) for text in given]


def cmd_create(cli: GlobalOptions, new: NewSandboxOptions) -> int:
    """``osb-sync create``: print the new sandbox's id (it is not deleted)."""
    with cli.client() as client:
        with progress("creating a sandbox"):
            try:
                sandbox = client.create_sandbox(
                    template=new.template,
                    timeout=new.lifetime,
                    metadata=new.metadata,
                    env_vars=new.env,
                    allow_internet_access=new.allow_internet or None,
                    network_policy=new.network_policy(),
                )
            except ApiError as exc:
                if "body.timeout" not in str(exc):
                    raise
                suffix = "(body.timeout is --lifetime: the server sets its range)"
                raise with_suffix(exc, suffix) from exc
        info = client.get_sandbox(sandbox.id)
    if cli.json:
        print(json.dumps(sandbox_json(info)))
    else:
        print_status(info.message, cli.verbose)
        print(sandbox.id)
    return 0


def cmd_list(cli: GlobalOptions, listing: ListOptions) -> int:
    """``osb-sync list``: a table (or a JSON array, or with -q the ids) of sandboxes."""
    with cli.client() as client:
        states = listing.state or None
        infos = list(client.list_sandboxes(states=states, metadata=listing.metadata))
    if cli.json:
        print(json.dumps([sandbox_json(info) for info in infos]))
    elif listing.quiet:
        for info in infos:
            print(info.id)
    else:
        rows = [sandbox_row(info) for info in infos]
        print_table(rows, ["id", "state", "created_at", "expires_at", "metadata"])
    return 0


def cmd_get(cli: GlobalOptions, given: IdsOptions) -> int:
    """``osb-sync get ID...``: each sandbox's description; exit 1 if one was not found."""
    found = []
    with cli.client() as client:
        for sandbox_id in resolve_ids(client, given.ids):
            info = _info_or_none(client, sandbox_id)
            if info is None:
                continue
            found.append(info)
            if not cli.json:
                if len(found) > 1:
                    print()
                for key, value in sandbox_row(info).items():
                    print(f"{key + ':':<12} {value}")
    if cli.json:
        shapes = [sandbox_json(info) for info in found]
        print(json.dumps(shapes[0] if len(given.ids) == 1 and shapes else shapes))
    return 0 if len(found) == len(given.ids) else EXIT_NOT_FOUND


def cmd_inspect(cli: GlobalOptions, given: IdsOptions) -> int:
    """``osb-sync inspect ID...``: a JSON array of sandboxes (as ``docker inspect``)."""
    with cli.client() as client:
        ids = resolve_ids(client, given.ids)
        found = [info for info in (_info_or_none(client, i) for i in ids) if info]
        shapes = [
            {**sandbox_json(info), "network_policy": _policy(client, info.id)} for info in found
        ]
    print(json.dumps(shapes, indent=2))
    return 0 if len(found) == len(given.ids) else EXIT_NOT_FOUND


def _policy(client: Client, sandbox_id: str) -> dict[str, Any] | None:
    """The network policy in force (its wire shape, with the server's mode), None where the
    server cannot say (no network policy routes, or the sandbox is gone meanwhile)."""
    try:
        policy = client.network_policy(sandbox_id).get()
    except (NotSupportedError, NotFoundError):
        return None
    return {**policy.to_dict(), "mode": policy.mode}


def _info_or_none(client: Client, sandbox_id: str, quiet: bool = False) -> SandboxInfo | None:
    try:
        return client.get_sandbox(sandbox_id)
    except NotFoundError as exc:
        if not names_missing_thing(exc):
            raise  # a 404 about the route: a wrong API base, not a missing sandbox
        if not quiet:
            print(f"osb-sync: error: no sandbox {sandbox_id} ({MAY_HAVE_EXPIRED})", file=sys.stderr)
        return None


def cmd_delete(cli: GlobalOptions, delete: DeleteOptions) -> int:
    """``osb-sync delete ID... | --all | --metadata K=V``: exit 1 if an id was not found."""
    if bool(delete.ids) + bool(delete.all) + bool(delete.metadata) != 1:
        raise UsageError("delete takes sandbox ids, --all, or --metadata KEY=VALUE (one of them)")
    if delete.all and not delete.yes:
        _confirm_all()
    outcomes = []
    with cli.client() as client:
        ids = resolve_ids(client, delete.ids)
        if delete.all or delete.metadata:
            ids = [info.id for info in client.list_sandboxes(metadata=delete.metadata)]
        if delete.all and not delete.yes and not _answer_yes(len(ids)):
            print("osb-sync: nothing deleted", file=sys.stderr)
            return 0
        for sandbox_id in ids:
            deleted = client.delete_sandbox(sandbox_id)
            outcomes.append({"id": sandbox_id, "deleted": deleted})
            if not cli.json:
                print(f"{'deleted' if deleted else 'not found'} {sandbox_id}")
    if cli.json:
        print(json.dumps(outcomes))
    # Under --all or --metadata a sandbox gone between the listing and its deletion is not
    # an error: the command's goal (none left) is met.
    missing = delete.ids and not all(o["deleted"] for o in outcomes)
    return EXIT_NOT_FOUND if missing else 0


def _confirm_all() -> None:
    """``rm --all`` without ``--yes``: only a person at a terminal may say yes.

    Raises:
        UsageError: standard input is not a terminal (a script: pass --yes).
    """
    if not sys.stdin.isatty():
        raise UsageError(
            "rm --all deletes every sandbox of the server, anyone's: on a terminal it asks "
            "first; here pass --yes (or delete by label: rm --metadata KEY=VALUE)"
        )


def _answer_yes(count: int) -> bool:
    """Ask on the terminal whether to delete ``count`` sandboxes; True for y or yes."""
    print(
        f"delete all {count} sandboxes of this server, anyone's? [y/N] ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def cmd_pause(cli: GlobalOptions, given: IdsOptions) -> int:
    """``osb-sync pause ID...``."""
    return _each(cli, given.ids, "paused", lambda client, sandbox_id: client.pause(sandbox_id))


def cmd_resume(cli: GlobalOptions, given: IdsOptions) -> int:
    """``osb-sync resume ID...``."""
    return _each(cli, given.ids, "resumed", lambda client, sandbox_id: client.resume(sandbox_id))


def cmd_renew(cli: GlobalOptions, renew: RenewOptions) -> int:
    """``osb-sync renew ID... [--lifetime SECONDS]``: print each new expiry."""

    def push_back(client: Client, sandbox_id: str) -> object:
        expires = client.renew(sandbox_id, renew.lifetime)
        return expires.isoformat() if expires else None

    return _each(cli, renew.ids, "renewed", push_back, "expires_at")


def cmd_stats(cli: GlobalOptions, given: IdsOptions) -> int:
    """``osb-sync stats ID...``: each sandbox's limits, and its usage against them where the
    server reads its cgroups (``osb-sync serve``), else execd's figures, the host's."""
    rows: list[dict[str, str]] = []
    shapes = []
    with cli.client() as client:
        ids = resolve_ids(client, given.ids)
        if not given.ids:  # as docker stats: every running one
            ids = [info.id for info in client.list_sandboxes(states=["Running"])]
        for sandbox_id in ids:
            try:
                shape = _stats(client, sandbox_id)
            except NotFoundError as exc:
                if not names_missing_thing(exc):
                    raise
                print(
                    f"osb-sync: error: no sandbox {sandbox_id} ({MAY_HAVE_EXPIRED})",
                    file=sys.stderr,
                )
                continue
            shapes.append(shape)
            rows.append(_stats_row(shape))
    if cli.json:
        print(json.dumps(shapes))
    else:
        print_table(rows, ["id", "cpus", "mem_limit", "of", "mem_used", "mem%", "cpu", "pids"])
    return 0 if len(shapes) == len(ids) else EXIT_NOT_FOUND


# Kubernetes quantities (the lifecycle API's resourceLimits): a number and a suffix.
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_SUFFIXES = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_SUFFIXES.update({f"{p}i": float(1 << (10 * n)) for n, p in enumerate("KMGTPE", 1)})


def quantity(text: str) -> float | None:
    """The value of a Kubernetes quantity (``256Mi``, ``500m``, ``1``), None if it is none."""
    found = _QUANTITY.fullmatch(text.strip())
    if found is None:
        return None
    value = float(found[1]) * _SUFFIXES.get(found[2] or "", 1.0)
    return value if math.isfinite(value) else None  # inf: not JSON in --json


def _mib(count: float | None) -> float | None:
    return None if count is None else round(count / (1 << 20), 3)


def _stats(client: Client, sandbox_id: str) -> dict[str, object]:
    """One sandbox's ``stats`` (its ``--json`` object): its limits as numbers (None where
    the server does not say them), then its own figures (``sandbox``) where the server reads
    them, else execd's (``host``)."""
    try:
        stats: SandboxStats | None = client.sandbox_stats(sandbox_id)
    except NotSupportedError:
        stats = None
    # OpenSandbox's Sandbox object has no resourceLimits: only the create knew them
    given = stats.resource_limits if stats else {}
    memory, cpu = quantity(given.get("memory", "")), quantity(given.get("cpu", ""))
    shape: dict[str, object] = {
        "id": sandbox_id,
        "limits": {"cpu": cpu, "memory_mib": _mib(memory), "given": given},
        "sandbox": None,
        "host": None,
    }
    if stats is not None and stats.source is not None:
        shape["sandbox"] = {
            "source": stats.source,
            "mem_used_mib": _mib(stats.memory_used_bytes),
            "mem_limit_mib": _mib(stats.memory_limit_bytes),
            "cpu_limit": stats.cpu_limit,
            "cpu_seconds": stats.cpu_seconds,
            "pids": stats.pids,
            "pids_limit": stats.pids_limit,
        }
    else:
        shape["host"] = vars(client.connect(sandbox_id).metrics())
    return shape


def _stats_row(shape: dict[str, Any]) -> dict[str, str]:
    """The table row of a ``_stats`` object: the limits, then whose figures, and they."""

    def shown(value: float | None, form: str) -> str:
        return "-" if value is None else format(value, form)

    limits, own, host = shape["limits"], shape["sandbox"], shape["host"]
    row = {
        "id": shape["id"],
        "cpus": shown(limits["cpu"], "g"),
        "mem_limit": shown(limits["memory_mib"], ".1f")
        + "MiB" * (limits["memory_mib"] is not None),
    }
    if own is not None:
        used, cap = own["mem_used_mib"], own["mem_limit_mib"] or limits["memory_mib"]
        pids = own["pids"]
        return {
            **row,
            "of": "sandbox",
            "mem_used": shown(used, ".1f") + "MiB" * (used is not None),
            "mem%": shown(100 * used / cap if used is not None and cap else None, ".1f"),
            "cpu": shown(own["cpu_seconds"], ".2f") + "s" * (own["cpu_seconds"] is not None),
            "pids": "-" if pids is None else f"{pids}/{shown(own['pids_limit'], 'd')}",
        }
    total = host["mem_total_mib"]
    return {
        **row,
        "of": "host",
        "mem_used": f"{host['mem_used_mib']:.1f}/{total:.1f}MiB",
        "mem%": shown(100 * host["mem_used_mib"] / total if total else None, ".1f"),
        "cpu": f"{host['cpu_used_pct']:.1f}% of {host['cpu_count']:g}",
        "pids": "-",
    }


def _each(
    cli: GlobalOptions,
    ids: list[str],
    done: str,
    call: Callable[[Client, str], object],
    field: str = "",
) -> int:
    """Apply ``call`` to each id; a line (or a JSON object) each; exit 1 if one was missing."""
    outcomes = []
    with cli.client() as client:
        for sandbox_id in resolve_ids(client, ids):
            try:
                value = call(client, sandbox_id)
            except NotFoundError as exc:
                if not names_missing_thing(exc):
                    raise
                outcomes.append({"id": sandbox_id, "found": False})
                if not cli.json:
                    print(f"not found {sandbox_id}")
                continue
            outcome: dict[str, object] = {"id": sandbox_id, "found": True}
            if field:
                outcome[field] = value
            outcomes.append(outcome)
            if not cli.json:
                print(f"{done} {sandbox_id}" + (f" {field}={value}" if field else ""))
    if cli.json:
        print(json.dumps(outcomes))
    return 0 if all(o["found"] for o in outcomes) else EXIT_NOT_FOUND
