"""Named pools of the local server: warm spares (`spares.py`) kept for a template.

The released server's pools are Kubernetes pre-warmed pods; here a pool is a `SparePool`
of containers launched ahead, and the create body its sandboxes are made from. Its
`template` is the spec's Kubernetes `PodTemplateSpec` (`pod_template_body`: the main
container's image, env and limits are honoured, execd's and task-executor's plumbing is
ignored with a note in the pool's `status.message`, any other field refused by name), or
our own create body (`TEMPLATE_FIELDS`).
A create with `extensions.poolRef` takes its workload from the pool's template (the request's
`metadata`, `env`, `timeout` and `resourceLimits` join it; a `networkPolicy`, `volumes` or a
`platform` are refused, as on the released server, since the pods exist already) and claims
one of its spares.

The `capacitySpec` counts: the pool keeps `bufferMin` idle spares, raised to reach `poolMin`
sandboxes in all, and never more than `bufferMax` idle nor `poolMax` in all; a create past
`poolMax` sandboxes gets 409: a create reserves its sandbox while it starts (`reserve`), and
`poolMax` counts the reservations too, so concurrent creates cannot pass it. Spares need
isolation (bubblewrap): without it a pool's creates are cold starts, and its status says so.
`status.revision` counts the pool's capacity changes. The store (`PoolStore`) and the routes
(`Pools`) are here; the registry takes a create's sandbox from one (`registry.py`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..http.bodies import rfc3339
from ..http.exchange import Exchange, HttpError, error
from . import network
from .sandboxes import Config
from .spares import SparePool
from .validation import check_create, issue, read_json, unprocessable, unprocessable_body

POOL_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
CAPACITY_FIELDS = ("bufferMax", "bufferMin", "poolMax", "poolMin")
# Fields of a create request that join a pool's template (the rest is the template's).
REQUEST_FIELDS = ("metadata", "env", "timeout", "resourceLimits")
# Fields a template may hold: a create body's, less what a started spare cannot take.
TEMPLATE_FIELDS = ("image", "entrypoint", "env", "resourceLimits", "metadata", "networkPolicy")
# What of a Kubernetes PodTemplateSpec the local server reads (`pod_template_body`).
POD_TEMPLATE_FIELDS = ("metadata", "spec")
POD_SPEC_FIELDS = ("containers", "initContainers", "volumes")
CONTAINER_FIELDS = ("name", "image", "command", "args", "env", "resources", "volumeMounts")
INIT_CONTAINER_FIELDS = ("name", "image", "command", "args", "volumeMounts")
PLUMBING_VOLUME = "opensandbox-bin"  # where the real pool's init containers put execd
PLUMBING_PATH = "/opt/opensandbox"
PLUMBING_ENV = ("EXECD", "EXECD_ENVS")


def pool_not_found(name: str) -> HttpError:
    """The released server's 404 for an unknown pool."""
    return error(404, "POOL::NOT_FOUND", f"Pool {name} not found.")


def check_name(name: Any) -> str:
    """A pool name (DNS-1123 label, at most 253 characters); FastAPI's 422 otherwise."""
    if not isinstance(name, str) or len(name) > 253 or not POOL_NAME.fullmatch(name):
        raise unprocessable(
            [
                issue(
                    "string_pattern_mismatch",
                    ["body", "name"],
                    "String should match pattern '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'",
                    name,
                )
            ]
        )
    return name


def check_capacity(spec: Any) -> dict[str, int]:
    """A `PoolCapacitySpec`; FastAPI's 422 naming the field when malformed, 400 when a
    minimum exceeds its maximum."""
    if not isinstance(spec, dict):
        raise unprocessable(
            [issue("dict_type", ["body", "capacitySpec"], "Input should be a dictionary", spec)]
        )
    found = [
        issue("missing", ["body", "capacitySpec", name], "Field required", spec)
        for name in CAPACITY_FIELDS
        if name not in spec
    ]
    found += [
        issue(
            "greater_than_equal",
            ["body", "capacitySpec", name],
            "Input should be an integer greater than or equal to 0",
            spec[name],
        )
        for name in CAPACITY_FIELDS
        if name in spec and (type(spec[name]) is not int or spec[name] < 0)
    ]
    if found:
        raise unprocessable(found)
    for low, high in (("bufferMin", "bufferMax"), ("poolMin", "poolMax")):
        if spec[low] > spec[high]:
            raise error(
                400,
                "POOL::INVALID_CAPACITY",
                f"capacitySpec.{low} ({spec[low]}) exceeds capacitySpec.{high} ({spec[high]}).",
            )
    return {name: spec[name] for name in CAPACITY_FIELDS}


def check_template(template: Any) -> tuple[dict[str, Any], str]:
    """A pool's template as the create body its sandboxes are made from, and the note on
    what of it was ignored (empty for none): the spec's Kubernetes `PodTemplateSpec` (a
    template with `spec`, `pod_template_body`), or our create body of `TEMPLATE_FIELDS`;
    400 naming any field neither can take."""
    if not isinstance(template, dict):
        raise unprocessable(
            [issue("dict_type", ["body", "template"], "Input should be a dictionary", template)]
        )
    if "spec" in template:
        return pod_template_body(template)
    unknown = sorted(set(template) - set(TEMPLATE_FIELDS))
    if unknown:
        raise error(
            400,
            "POOL::INVALID_TEMPLATE",
            f"template.{unknown[0]} is not supported: the local server's pool template is a "
            "Kubernetes PodTemplateSpec (metadata, spec), or a create body of "
            f"{', '.join(TEMPLATE_FIELDS)} (its sandboxes start before their create, so "
            "nothing fixed at start, such as volumes).",
        )
    return dict(template), ""


def _invalid(where: str, why: str) -> HttpError:
    return error(400, "POOL::INVALID_TEMPLATE", f"template.{where} is not supported: {why}.")


def _fields(value: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """`value` as an object whose keys are all `allowed`; 400 naming the first other."""
    if not isinstance(value, dict):
        raise _invalid(where, "it must be an object")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise _invalid(f"{where}.{unknown[0]}", f"{where} may hold {', '.join(allowed)}")
    return value


def _items(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _invalid(where, "it must be a list")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _invalid(where, "it must be a list of strings")
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _invalid(where, "it must be an object of strings")
    return value


def _plumbing_mounts(container: dict[str, Any], where: str) -> None:
    """A container's mounts: only execd's `opensandbox-bin` at /opt/opensandbox."""
    for index, mount in enumerate(_items(container.get("volumeMounts", []), where)):
        at = f"{where}[{index}]"
        mount = _fields(mount, at, ("name", "mountPath", "readOnly"))
        if (mount.get("name"), mount.get("mountPath")) != (PLUMBING_VOLUME, PLUMBING_PATH):
            raise _invalid(
                at,
                f"only the {PLUMBING_VOLUME} volume at {PLUMBING_PATH} (execd's plumbing, "
                "not needed here) may be mounted",
            )


def _runs_task_executor(command: list[str]) -> bool:
    return bool(command) and command[0].rsplit("/", 1)[-1] == "task-executor"


def pod_template_body(template: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The create body a Kubernetes `PodTemplateSpec` makes here, and the note on what of it
    was ignored; 400 (`POOL::INVALID_TEMPLATE`) naming the first field it cannot take.

    Honoured: the main (only) container's `image`, `env` and `resources.limits`. Ignored, as
    the plumbing of execd and task-executor a local runtime does not need (the reference's
    pool sample): init containers that only mount `opensandbox-bin`, that `emptyDir` volume
    and its mounts at /opt/opensandbox, a main `command` (and `args`) that runs
    task-executor, the env `EXECD` and `EXECD_ENVS`; also the pod's labels and annotations
    and `resources.requests` (a scheduler's hint). Nothing of it is ever run or mounted: no
    image of an init container, no command, no host path.
    """
    unknown = sorted(set(template) - set(POD_TEMPLATE_FIELDS))
    if unknown:
        raise _invalid(unknown[0], "a PodTemplateSpec here holds metadata and spec")
    ignored: list[str] = []
    metadata = _fields(template.get("metadata", {}), "metadata", ("labels", "annotations"))
    for name, value in metadata.items():
        _string_map(value, f"metadata.{name}")
        ignored.append(f"metadata.{name}")
    spec = _fields(template["spec"], "spec", POD_SPEC_FIELDS)
    for index, volume in enumerate(_items(spec.get("volumes", []), "spec.volumes")):
        at = f"spec.volumes[{index}]"
        volume = _fields(volume, at, ("name", "emptyDir"))
        if volume.get("name") != PLUMBING_VOLUME or not isinstance(volume.get("emptyDir"), dict):
            raise _invalid(at, f"only the {PLUMBING_VOLUME} emptyDir (execd's plumbing) is")
        empty_dir = _fields(volume["emptyDir"], f"{at}.emptyDir", ("medium", "sizeLimit"))
        medium, size = empty_dir.get("medium", ""), empty_dir.get("sizeLimit", "")
        if not isinstance(medium, str) or type(size) not in (str, int):
            raise _invalid(f"{at}.emptyDir", "medium is a string, sizeLimit a quantity")
        ignored.append(f"volume {PLUMBING_VOLUME}")
    for index, init in enumerate(_items(spec.get("initContainers", []), "spec.initContainers")):
        at = f"spec.initContainers[{index}]"
        init = _fields(init, at, INIT_CONTAINER_FIELDS)
        _plumbing_mounts(init, f"{at}.volumeMounts")
        ignored.append(f"init container {init.get('name', index)!s}")
    containers = _items(spec.get("containers"), "spec.containers")
    if len(containers) != 1:
        raise _invalid(
            "spec.containers", f"exactly one container (the sandbox's) is, not {len(containers)}"
        )
    main = _fields(containers[0], "spec.containers[0]", CONTAINER_FIELDS)
    where = "spec.containers[0]"
    image = main.get("image")
    if not isinstance(image, str) or not image:
        raise _invalid(f"{where}.image", "it must be the sandbox's image")
    body: dict[str, Any] = {"image": {"uri": image}}
    command = _strings(main.get("command", []), f"{where}.command")
    args = _strings(main.get("args", []), f"{where}.args")
    if command or args:
        if not _runs_task_executor(command):
            raise _invalid(
                f"{where}.command",
                "only a command that runs task-executor (the pool's plumbing) is; each "
                "create brings the sandbox's own entrypoint",
            )
        ignored.append("the task-executor command")
    env: dict[str, str] = {}
    for index, item in enumerate(_items(main.get("env", []), f"{where}.env")):
        at = f"{where}.env[{index}]"
        item = _fields(item, at, ("name", "value"))
        key, value = item.get("name"), item.get("value", "")
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise _invalid(at, "an env entry is a name and a string value")
        if key in PLUMBING_ENV:
            ignored.append(f"env {key}")
        else:
            env[key] = value
    if env:
        body["env"] = env
    resources = _fields(main.get("resources", {}), f"{where}.resources", ("limits", "requests"))
    body["resourceLimits"] = dict(
        _string_map(resources.get("limits", {}), f"{where}.resources.limits")
    )
    if "requests" in resources:
        _string_map(resources["requests"], f"{where}.resources.requests")
        ignored.append("resources.requests")
    _plumbing_mounts(main, f"{where}.volumeMounts")
    note = ""
    if ignored:
        note = (
            "PodTemplateSpec: honoured the container's image, env and resource limits; "
            f"ignored (execd and task-executor plumbing, pod metadata): {', '.join(ignored)}"
        )
    return body, note


@dataclass
class LocalPool:
    """One pool: its template, capacity, spares and the sandboxes it gave out."""

    name: str
    template: dict[str, Any]
    capacity: dict[str, int]
    spares: SparePool
    allocated: set[str] = field(default_factory=set)
    reserved: int = 0  # creates that took one and are starting
    revision: int = 1
    note: str = ""  # what of its template was ignored (`pod_template_body`)
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def resize(self) -> None:
        """Set how many idle spares to keep from the capacity and the sandboxes given out."""
        cap, used = self.capacity, len(self.allocated)
        idle = max(cap["bufferMin"], cap["poolMin"] - used)
        self.spares.count = max(0, min(idle, cap["bufferMax"], cap["poolMax"] - used))
        self.spares.fill()

    def view(self) -> dict[str, Any]:
        """The released server's `PoolResponse`; `status.message`, ours, is the note on what
        of the template was ignored (when anything was)."""
        available = len(self.spares.ready())
        status: dict[str, Any] = {
            "total": len(self.allocated) + available,
            "allocated": len(self.allocated),
            "available": available,
            "revision": str(self.revision),
        }
        if self.note:
            status["message"] = self.note
        return {
            "name": self.name,
            "capacitySpec": dict(self.capacity),
            "status": status,
            "createdAt": rfc3339(self.created_at),
        }


class PoolStore:
    """Every pool of one server (one lock).

    Args:
        new_spares: makes the SparePool of a new pool, given its idle count.
    """

    def __init__(self, new_spares: Callable[[int], SparePool]) -> None:
        self._new_spares = new_spares
        self._lock = threading.Lock()
        self._pools: dict[str, LocalPool] = {}

    def create(
        self, name: str, template: dict[str, Any], capacity: dict[str, int], note: str = ""
    ) -> LocalPool:
        """Add a pool and start its spares; 409 when the name is taken."""
        with self._lock:
            if name in self._pools:
                raise error(409, "POOL::ALREADY_EXISTS", f"Pool {name} already exists.")
            pool = LocalPool(name, template, capacity, self._new_spares(0), note=note)
            self._pools[name] = pool
        pool.resize()
        return pool

    def get(self, name: str) -> LocalPool:
        """The pool `name`; 404 when there is none."""
        with self._lock:
            pool = self._pools.get(name)
        if pool is None:
            raise pool_not_found(name)
        return pool

    def all(self) -> list[LocalPool]:
        """Every pool, oldest first."""
        with self._lock:
            return sorted(self._pools.values(), key=lambda p: p.created_at)

    def update(self, name: str, capacity: dict[str, int]) -> LocalPool:
        """Change a pool's capacity (its spares follow)."""
        pool = self.get(name)
        with self._lock:
            pool.capacity = capacity
            pool.revision += 1
        pool.resize()
        return pool

    def delete(self, name: str) -> None:
        """Remove a pool and kill its idle spares (its sandboxes keep running); 404 if unknown."""
        with self._lock:
            pool = self._pools.pop(name, None)
        if pool is None:
            raise pool_not_found(name)
        pool.spares.close()

    def reserve(self, name: str) -> LocalPool:
        """Reserve a sandbox of the pool `name` for a create (`allocate` or `cancel` it once the
        create is done); 409 when `poolMax` are given out or reserved already."""
        pool = self.get(name)
        with self._lock:
            if len(pool.allocated) + pool.reserved >= pool.capacity["poolMax"]:
                raise error(
                    409,
                    "POOL::EXHAUSTED",
                    f"Pool {name} has given out its poolMax of {pool.capacity['poolMax']} "
                    "sandboxes; delete one or raise capacitySpec.poolMax.",
                )
            pool.reserved += 1
        return pool

    def allocate(self, pool: LocalPool, sandbox_id: str) -> None:
        """Count a sandbox made from the pool, in place of its reservation."""
        with self._lock:
            pool.reserved -= 1
            pool.allocated.add(sandbox_id)
        pool.resize()

    def cancel(self, pool: LocalPool) -> None:
        """Drop a reservation of a create that failed."""
        with self._lock:
            pool.reserved -= 1

    def release(self, sandbox_id: str) -> None:
        """A sandbox is gone: the pool it came from (if any) counts it no more."""
        with self._lock:
            pools = [p for p in self._pools.values() if sandbox_id in p.allocated]
            for pool in pools:
                pool.allocated.discard(sandbox_id)
        for pool in pools:
            pool.resize()

    def replace_dead(self) -> None:
        """Replace every pool's dead spares (from the server's reaper)."""
        for pool in self.all():
            pool.spares.replace_dead()

    def close(self) -> None:
        """Kill every pool's spares (server stop)."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.spares.close()


# What a create with `extensions.poolRef` may not have, as on the released server (400): its
# sandbox exists already, made from the pool's template.
POOL_REFUSED = {
    "networkPolicy": "change it after the create with /networkpolicy",
    "volumes": "create without extensions.poolRef to mount volumes",
    "platform": "the pool's template decides it",
}


def pooled_body(pool: LocalPool, request: dict[str, Any]) -> dict[str, Any]:
    """The create body of a sandbox from `pool`: its template, and the request's own fields.

    Raises:
        HttpError: 400 for a `networkPolicy`, `volumes` or `platform` in the request, as on
            the released server.
    """
    for name, fix in POOL_REFUSED.items():
        if request.get(name) not in (None, []):
            raise error(
                400,
                "SANDBOX::INVALID_PARAMETER",
                f"{name} is not supported together with extensions.poolRef: the pool's "
                f"sandboxes exist already ({fix}).",
            )
    body = template_body(pool.template)
    for name in REQUEST_FIELDS:
        if request.get(name) is not None:
            body[name] = request[name]
    body["extensions"] = dict(request.get("extensions") or {})
    return body


def template_body(template: dict[str, Any]) -> dict[str, Any]:
    """The create body a pool's template makes: the template, with defaults for what a
    create needs and it may leave out (no limits, a placeholder image, an idle entrypoint)."""
    body = {"resourceLimits": {}, "image": {"uri": "osb-sync/pool"}, **template}
    body.setdefault("entrypoint", ["tail", "-f", "/dev/null"])
    return body


class Pools:
    """The handlers of the pool routes, a store of their own."""

    def __init__(self, config: Config, new_spares: Callable[[int], SparePool]) -> None:
        self.config = config
        self.store = PoolStore(new_spares)

    def create(self, ex: Exchange) -> None:
        """POST /pools: a named pool of warm spares with its capacitySpec; 201."""
        body = read_json(ex)
        if not isinstance(body, dict):
            raise unprocessable_body("a CreatePoolRequest object", body)
        name = check_name(body.get("name"))
        template, note = check_template(body.get("template"))
        capacity = check_capacity(body.get("capacitySpec"))
        check_create(template_body(template), self.config.min_timeout, self.config.max_timeout)
        network.plan(template.get("networkPolicy"), self.config)
        ex.send_json(201, self.store.create(name, template, capacity, note).view())

    def list(self, ex: Exchange) -> None:
        """GET /pools."""
        ex.send_json(200, {"items": [pool.view() for pool in self.store.all()]})

    def show(self, ex: Exchange) -> None:
        """GET /pools/{name}."""
        ex.send_json(200, self.store.get(ex.params["name"]).view())

    def update(self, ex: Exchange) -> None:
        """PUT /pools/{name}: a new capacitySpec."""
        body = read_json(ex)
        if not isinstance(body, dict):
            raise unprocessable_body("an UpdatePoolRequest object", body)
        capacity = check_capacity(body.get("capacitySpec"))
        ex.send_json(200, self.store.update(ex.params["name"], capacity).view())

    def delete(self, ex: Exchange) -> None:
        """DELETE /pools/{name}: 204 (its sandboxes keep running)."""
        self.store.delete(ex.params["name"])
        ex.send(204)
