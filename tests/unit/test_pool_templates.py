"""The local server's pool template: the spec's Kubernetes PodTemplateSpec, read as the
create body its sandboxes are made from; untrusted input, refused field by field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from osb_sync.local.host.pools import check_template
from osb_sync.local.http.exchange import HttpError

SAMPLE = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "pool-template.json").read_text()
)


def test_the_reference_sample_is_taken_unchanged() -> None:
    sample = copy.deepcopy(SAMPLE)
    body, note = check_template(sample)
    assert sample == SAMPLE  # not modified
    assert body == {
        "image": {"uri": "opensandbox/code-interpreter:v1.1.0"},
        "env": {"LANG": "C.UTF-8"},
        "resourceLimits": {"cpu": "1", "memory": "2Gi"},
    }
    for ignored in (
        "execd-installer",
        "task-executor-installer",
        "opensandbox-bin",
        "task-executor command",
        "env EXECD",
        "env EXECD_ENVS",
        "resources.requests",
        "metadata.labels",
    ):
        assert ignored in note


def test_a_create_body_template_stays_as_it_was() -> None:
    template = {"image": {"uri": "python:3.12"}, "entrypoint": ["/bin/sh"]}
    assert check_template(template) == (template, "")


def spec_with(**main: Any) -> dict[str, Any]:
    container = {"name": "sandbox", "image": "python:3.12", **main}
    return {"spec": {"containers": [container]}}


@pytest.mark.parametrize(
    ("template", "named"),
    [
        ({"spec": {}, "kind": "Pod"}, "template.kind"),
        ({"metadata": {"name": "x"}, "spec": {}}, "template.metadata.name"),
        ({"metadata": [], "spec": {}}, "template.metadata"),
        ({"spec": {"nodeSelector": {"a": "b"}, "containers": []}}, "template.spec.nodeSelector"),
        ({"spec": {"hostNetwork": True}}, "template.spec.hostNetwork"),
        # a host path is never mounted, whatever it is called
        (
            {"spec": {"volumes": [{"name": "opensandbox-bin", "hostPath": {"path": "/"}}]}},
            "template.spec.volumes[0].hostPath",
        ),
        ({"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}}, "template.spec.volumes[0]"),
        (
            {"spec": {"volumes": [{"name": "opensandbox-bin", "emptyDir": {"hostPath": "/"}}]}},
            "template.spec.volumes[0].emptyDir.hostPath",
        ),
        (
            {"spec": {"volumes": [{"name": "opensandbox-bin", "emptyDir": {"medium": {}}}]}},
            "template.spec.volumes[0].emptyDir",
        ),
        ({"spec": {"containers": []}}, "template.spec.containers"),
        (
            {"spec": {"containers": [{"image": "a"}, {"image": "b"}]}},
            "template.spec.containers",
        ),
        (spec_with(securityContext={"privileged": True}), "containers[0].securityContext"),
        (spec_with(ports=[{"containerPort": 80}]), "containers[0].ports"),
        (spec_with(image=""), "containers[0].image"),
        (spec_with(image=["x"]), "containers[0].image"),
        (spec_with(command=["/bin/sh", "-c", "rm -rf /"]), "containers[0].command"),
        (spec_with(args=["-listen", ":1"]), "containers[0].command"),
        (spec_with(command="task-executor"), "containers[0].command"),
        (spec_with(env=[{"name": "A", "valueFrom": {"secretKeyRef": {}}}]), "env[0].valueFrom"),
        (spec_with(env=[{"name": "A", "value": 1}]), "env[0]"),
        (spec_with(env={"A": "1"}), "containers[0].env"),
        (spec_with(resources={"claims": []}), "resources.claims"),
        (spec_with(resources={"limits": {"cpu": 1}}), "resources.limits"),
        (
            spec_with(volumeMounts=[{"name": "opensandbox-bin", "mountPath": "/etc"}]),
            "containers[0].volumeMounts[0]",
        ),
        (
            {
                "spec": {
                    "initContainers": [
                        {
                            "name": "i",
                            "image": "x",
                            "volumeMounts": [{"name": "h", "mountPath": "/"}],
                        }
                    ],
                    "containers": [{"image": "a"}],
                }
            },
            "template.spec.initContainers[0].volumeMounts[0]",
        ),
        (
            {"spec": {"initContainers": [{"name": "i", "securityContext": {}}]}},
            "initContainers[0].securityContext",
        ),
        ({"spec": "containers"}, "template.spec"),
    ],
)
def test_what_it_cannot_take_is_refused_by_name(template: dict[str, Any], named: str) -> None:
    with pytest.raises(HttpError) as info:
        check_template(template)
    assert info.value.status == 400
    assert info.value.body["code"] == "POOL::INVALID_TEMPLATE"
    assert named in info.value.body["message"]


def test_a_main_command_that_runs_task_executor_is_plumbing() -> None:
    body, note = check_template(spec_with(command=["task-executor"], args=["-listen", ":5758"]))
    assert "entrypoint" not in body and "task-executor command" in note
