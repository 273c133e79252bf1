"""The image builds from a local base, and the container drill runs what the chart renders.

``make image`` and ``make container-drill`` are too slow for ``make test``; this
checks what they rely on: every stage of every Dockerfile starts from the base
image build argument (so no stage needs a registry), and the ``podman run``
command lines of ``deploy/podman/container_drill.py`` come from the rendered
chart (its security context, its ConfigMaps' environment, its volumes), not from
a copy — a changed value changes the command line.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lazarus_dev.drill_remote import KubectlInjector

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "deploy" / "Dockerfile", ROOT / "deploy" / "podman" / "service.Containerfile"]
IMAGE_VALUES = {
    "image": {"repository": "localhost/lazarus", "tag": "0.1.0"},
    "tls": {"enabled": False},  # as container_drill.py renders it
}


def _drill_module() -> ModuleType:
    path = ROOT / "deploy" / "podman" / "container_drill.py"
    spec = importlib.util.spec_from_file_location("container_drill", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("container_drill", module)
    spec.loader.exec_module(module)
    return module


cd = _drill_module()


def _plan(values: dict[str, Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    objects = cd.render_chart(values)
    pods = cd.plan_pods(objects)
    for pod in pods:
        pod.run_argv = cd.run_argv(pod, objects, run_id="test")
    return pods, objects


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def _env(argv: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in _flag_values(argv, "--env"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_stage_starts_from_the_base_image_argument(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    first_from = re.search(r"^FROM\s", text, flags=re.M)
    assert first_from is not None
    global_args = re.findall(r"^ARG\s+BASE_IMAGE(?:=(\S+))?", text[: first_from.start()], re.M)
    assert global_args, "ARG BASE_IMAGE before the first FROM"
    stages = re.findall(r"^FROM\s+(?:--\S+\s+)*(\S+)", text, flags=re.M)
    assert stages
    for image in stages:
        assert image in ("${BASE_IMAGE}", "$BASE_IMAGE"), f"a stage starts FROM {image}"


def test_make_image_passes_the_base_to_every_build() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nimage:", 1)[1].split("\n\n", 1)[0]
    builds = [line for line in recipe.splitlines() if "podman build" in line]
    assert builds
    assert all("--build-arg BASE_IMAGE=" in line for line in builds)
    assert recipe.count("service-image.sh $(BASE_IMAGE)") == 2  # etcd and Redis


def test_drill_containers_carry_the_charts_security_settings() -> None:
    pods, _ = _plan(IMAGE_VALUES)
    assert sorted(p.component for p in pods) == [
        "coordinator", "coordinator", "coordinator", "etcd",
        "node-agent", "node-agent", "node-agent", "redis",
    ]  # fmt: skip
    for pod in pods:
        spec = pod.workload["spec"]["template"]["spec"]
        pod_ctx, ctx = spec["securityContext"], pod.container["securityContext"]
        argv = pod.run_argv
        assert _flag_values(argv, "--user") == [f"{pod_ctx['runAsUser']}:{pod_ctx['runAsGroup']}"]
        assert pod_ctx["runAsUser"] != 0
        assert ctx["readOnlyRootFilesystem"] is True
        assert "--read-only" in argv
        assert "--read-only-tmpfs=false" in argv
        assert [a for a in argv if a.startswith("--cap-drop=")] == ["--cap-drop=ALL"]
        assert not [a for a in argv if a.startswith("--cap-add")]
        assert "no-new-privileges" in _flag_values(argv, "--security-opt")
        grace = spec.get("terminationGracePeriodSeconds", 30)  # Kubernetes default
        assert _flag_values(argv, "--stop-timeout") == [str(grace)]
        image = argv[argv.index(pod.container["image"])]
        env = _env(argv)
        assert argv[argv.index(image) + 1 :] == [
            cd.expand(str(a), env) for a in pod.container.get("args", [])
        ]
        for mount in pod.container.get("volumeMounts", []):
            mounted = [v.split(":")[1] for v in _flag_values(argv, "-v")]
            mounted += [t.split(":")[0] for t in _flag_values(argv, "--tmpfs")]
            assert mount["mountPath"] in mounted, mount


def test_drill_environment_is_the_rendered_configmaps_and_downward_api() -> None:
    pods, objects = _plan(IMAGE_VALUES)
    configmaps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    for pod in pods:
        if pod.component not in ("coordinator", "node-agent"):
            continue
        env = _env(pod.run_argv)
        (source,) = pod.container["envFrom"]
        expected = dict(configmaps[source["configMapRef"]["name"]])
        if pod.component == "coordinator":
            expected |= {"LAZARUS_MEMBER_ID": pod.name, "LAZARUS_ADVERTISE_ADDRESS": pod.ip}
        else:
            expected |= {"LAZARUS_NODE_ID": pod.name}
        secrets = cd.chart_secrets(objects)  # the in-chart Redis's generated password
        (redis_auth,) = [name for name in secrets if name.endswith("-redis-auth")]
        expected |= {"LAZARUS_REDIS_PASSWORD": secrets[redis_auth]["password"]}
        assert env == expected, pod.name
        assert pod.run_argv[-1] == pod.component  # the entrypoint's argument: the sub-command


def test_changed_chart_values_change_the_containers() -> None:
    values = {
        **IMAGE_VALUES,
        "podSecurityContext": {"runAsUser": 12345, "runAsGroup": 23456, "fsGroup": 23456},
        "coordinator": {"settings": {"deadAfterS": 7.5}, "replicas": 5},
        "nodeAgent": {"settings": {"durability": "replicated"}},
        "etcd": {"image": {"repository": "localhost/lazarus-etcd", "tag": "3.4.23"}},
    }
    pods, _ = _plan(values)
    coordinators = [p for p in pods if p.component == "coordinator"]
    assert len(coordinators) == 5
    for pod in coordinators:
        assert _flag_values(pod.run_argv, "--user") == ["12345:23456"]
        assert _env(pod.run_argv)["LAZARUS_DEAD_AFTER_S"] == "7.5"
    agent = next(p for p in pods if p.component == "node-agent")
    assert _env(agent.run_argv)["LAZARUS_DURABILITY"] == "replicated"
    etcd = next(p for p in pods if p.component == "etcd")
    assert "localhost/lazarus-etcd:3.4.23" in etcd.run_argv


def test_services_resolve_to_the_pods_they_select() -> None:
    pods, _ = _plan(IMAGE_VALUES)
    by_name = {p.name: p for p in pods}
    agent_env = _env(next(p for p in pods if p.component == "node-agent").run_argv)
    coordinator_host = agent_env["LAZARUS_COORDINATORS"].rsplit(":", 1)[0]
    redis_host = agent_env["LAZARUS_REDIS_URL"].split("//")[1].split(":")[0]
    for pod in by_name.values():
        aliases = _flag_values(pod.run_argv, "--network-alias")
        assert (coordinator_host in aliases) == (pod.component == "coordinator"), pod.name
        assert (redis_host in aliases) == (pod.component == "redis"), pod.name
    etcd_host = _env(next(p for p in pods if p.component == "coordinator").run_argv)[
        "LAZARUS_ETCD_ENDPOINT"
    ].rsplit(":", 1)[0]
    assert etcd_host in _flag_values(by_name["lazarus-etcd-0"].run_argv, "--network-alias")


def test_secrets_come_from_the_command_line_not_podman() -> None:
    values = {
        **IMAGE_VALUES,
        "redis": {"enabled": False},
        "externalRedis": {
            "url": "redis://redis.example:6379/0",
            "auth": {"enabled": True, "existingSecret": "lazarus-redis-auth"},
        },
    }
    objects = cd.render_chart(values)
    agent = next(p for p in cd.plan_pods(objects) if p.component == "node-agent")
    with pytest.raises(cd.ChartError, match="--secret lazarus-redis-auth"):
        cd.run_argv(agent, objects, run_id="test")
    argv = cd.run_argv(
        agent, objects, run_id="test", secrets={"lazarus-redis-auth": {"password": "s3cret"}}
    )
    assert _env(argv)["LAZARUS_REDIS_PASSWORD"] == "s3cret"


def test_the_kubectl_stand_in_understands_the_remote_drill() -> None:
    argv = KubectlInjector("lazarus", context="kind").command("lazarus-node-agent-1")
    assert cd.deleted_pod(argv[1:]) == "lazarus-node-agent-1"
    assert cd.deleted_pod(["get", "pods"]) is None


def test_in_chart_redis_accepts_the_agents_without_the_images_entrypoint() -> None:
    # No `command`: the image's entrypoint (if any) stays; Redis requires the generated
    # password, so protected mode admits remote clients that AUTH with it (Debian's
    # redis-server too: tests/integration/test_chart_redis.py runs these args).
    pods, _ = _plan(IMAGE_VALUES)
    redis = next(p for p in pods if p.component == "redis")
    assert "command" not in redis.container
    argv = redis.run_argv
    password = argv[argv.index("--requirepass") + 1]
    assert password
    assert "$(" not in password  # expanded as the kubelet does
    agent = next(p for p in pods if p.component == "node-agent")
    assert _env(agent.run_argv)["LAZARUS_REDIS_PASSWORD"] == password
