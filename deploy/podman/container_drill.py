"""The Helm chart's pods as podman containers, and the remote drills against them.

``make container-drill`` runs this: the chart is rendered (``helm_python``, the
renderer the chart tests use; no cluster, no helm binary) and every pod of its
Deployments and StatefulSets becomes a podman container on a user network with
name resolution (netavark + aardvark-dns), carrying the pod's settings as the
chart renders them:

- image, command and args; the environment from ``envFrom`` ConfigMaps and
  ``env`` (``fieldRef`` metadata.name / status.podIP / spec.nodeName resolved
  the way the kubelet does; ``secretKeyRef`` from ``--secret``);
- the security context: the uid/gid (``--user``; ``runAsNonRoot`` refuses uid
  0), ``fsGroup`` (supplementary group, volumes chowned), a read-only root
  filesystem with no tmpfs of podman's own (only the chart's volumes are
  writable), dropped and added capabilities, ``no-new-privileges``;
- volumes as directories the script makes under ``--run-dir`` the way the
  kubelet does (bind mounts: podman's named volumes copy the image's files at
  the mount point and keep their owner, 0700 etcd:etcd in Debian's etcd
  image): ``emptyDir`` (a tmpfs when it has a size limit, else an empty 0777
  directory that dies with the pod), claims of ``volumeClaimTemplates`` (a
  directory group-owned by ``fsGroup``, setgid, kept across re-creation as a
  PersistentVolumeClaim is), ``hostPath`` and ``secret`` volumes
  (``--secret-dir``);
- CPU and memory limits, ``terminationGracePeriodSeconds`` as the stop timeout;
- readiness probes, run from the host as the kubelet runs them (grpc, httpGet,
  tcpSocket; exec through ``podman exec``).

What podman lacks is made here, not in the chart: a Service is a DNS alias of
every container its selector matches (``name``, ``name.ns``, ``name.ns.svc``);
Deployment and StatefulSet pods are named ``<workload>-<ordinal>``; a Secret is
a value given on the command line (podman's secrets cannot hold Kubernetes'
key/value Secrets); ``kubectl delete pod --force`` is a small ``kubectl`` on the
drill's PATH that SIGKILLs and removes the container and re-creates it with the
same name, address and claims after ``--recreate-after-s`` (the controller).

Then ``lazarus drill kill-node`` and ``lazarus drill kill-leader`` run against
the coordinators' addresses (``lazarus_dev/drill_remote.py``) and print their
reports. Exit status 1 when a drill failed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "deploy" / "helm" / "lazarus"
RELEASE = "lazarus"
NAMESPACE = "lazarus"
NETWORK = "lazarus-drill"
SUBNET = "198.19.210.0/24"
"""Inside 198.18.0.0/15 (benchmark space) and clear of the drills' /30s."""
LABEL = "io.lazarus.container-drill"
WORKLOAD_KINDS = ("StatefulSet", "Deployment", "DaemonSet")


class ChartError(RuntimeError):
    """The rendered chart asks for something this translation cannot do."""


@dataclass
class Pod:
    """One pod of a rendered workload, as the podman container that plays it."""

    name: str
    component: str
    workload: dict[str, Any]
    container: dict[str, Any]
    labels: dict[str, str]
    ip: str = ""
    aliases: list[str] = field(default_factory=list)
    run_argv: list[str] = field(default_factory=list)
    host_dirs: list[tuple[str, int, int | None, bool]] = field(default_factory=list)
    """(directory, mode, group, dies with the pod) of each volume, made before the run."""


# ------------------------------------------------------------------ rendering


def render_chart(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's objects for ``values``, rendered by helm_python (no cluster)."""
    import helm_python as helm

    manifests = helm.Chart.load(CHART_DIR).render(
        values=copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE, is_install=True
    )
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith((".yaml", ".yml")):
            objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def set_value(values: dict[str, Any], assignment: str) -> None:
    """Apply one ``--set a.b.c=value`` (the value parsed as YAML, like helm)."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path:
        raise ValueError(f"--set {assignment!r}: expected key.path=value")
    *parents, leaf = path.split(".")
    node = values
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = yaml.safe_load(raw) if raw else ""


def plan_pods(objects: list[dict[str, Any]], subnet: str = SUBNET) -> list[Pod]:
    """Every pod of the rendered workloads, stores first, with a fixed address each."""
    order = {"etcd": 0, "redis": 1, "coordinator": 2, "node-agent": 3}
    pods: list[Pod] = []
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        template = obj["spec"]["template"]
        labels = dict(template["metadata"].get("labels", {}))
        component = labels.get("app.kubernetes.io/component", obj["metadata"]["name"])
        replicas = obj["spec"].get("replicas", 1) if obj["kind"] != "DaemonSet" else 1
        (container,) = template["spec"]["containers"]
        for ordinal in range(replicas):
            pods.append(
                Pod(f"{obj['metadata']['name']}-{ordinal}", component, obj, container, labels)
            )
    pods.sort(key=lambda p: (order.get(p.component, 9), p.name))
    prefix = subnet.rsplit(".", 1)[0]
    for index, pod in enumerate(pods):
        pod.ip = f"{prefix}.{10 + index}"
    for service in (o for o in objects if o["kind"] == "Service"):
        selector = service["spec"].get("selector", {})
        name = service["metadata"]["name"]
        for pod in pods:
            if selector and selector.items() <= pod.labels.items():
                pod.aliases += [name, f"{name}.{NAMESPACE}", f"{name}.{NAMESPACE}.svc"]
    return pods


def pod_env(
    pod: Pod, objects: list[dict[str, Any]], secrets: dict[str, dict[str, str]]
) -> dict[str, str]:
    """The container's environment as the kubelet would set it."""
    configmaps = {
        o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"
    }
    env: dict[str, str] = {}
    for source in pod.container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]])
        elif "secretRef" in source:
            env.update(_secret(secrets, source["secretRef"]["name"]))
        else:
            raise ChartError(f"{pod.name}: envFrom {source} is not translated")
    fields = {"metadata.name": pod.name, "status.podIP": pod.ip, "spec.nodeName": "podman-host"}
    fields["metadata.namespace"] = NAMESPACE
    for item in pod.container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)  # $(VAR), as the kubelet
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[item["name"]] = _secret(secrets, ref["name"])[ref["key"]]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[item["name"]] = configmaps[ref["name"]][ref["key"]]
        else:
            raise ChartError(f"{pod.name}: env {item['name']} from {source} is not translated")
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` references replaced from ``env``, as the kubelet does in env, command, args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def chart_secrets(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Secrets the chart renders itself (the in-chart Redis's generated password)."""
    return {
        o["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in o["data"].items()}
        for o in objects
        if o["kind"] == "Secret" and o.get("data")
    }


def _secret(secrets: dict[str, dict[str, str]], name: str) -> dict[str, str]:
    if name not in secrets:
        raise ChartError(f"the chart needs Secret {name}: give --secret {name}/KEY=VALUE")
    return secrets[name]


def _quantity_cpus(value: str | int | float) -> str:
    text = str(value)
    return str(int(text[:-1]) / 1000) if text.endswith("m") else text


def _quantity_bytes(value: str | int) -> str:
    text = str(value)
    units = {"Ki": "k", "Mi": "m", "Gi": "g", "K": "k", "M": "m", "G": "g"}
    for suffix, short in units.items():
        if text.endswith(suffix):
            return text[: -len(suffix)] + short
    return text


def security_args(pod: Pod) -> list[str]:
    """podman flags for the pod's and the container's securityContext.

    Raises:
        ChartError: runAsNonRoot with uid 0, or a setting with no podman equivalent.
    """
    pod_ctx = pod.workload["spec"]["template"]["spec"].get("securityContext", {})
    ctx = {**pod_ctx, **pod.container.get("securityContext", {})}
    args: list[str] = []
    uid = ctx.get("runAsUser")
    if ctx.get("runAsNonRoot") and (uid is None or int(uid) == 0):
        raise ChartError(f"{pod.name}: runAsNonRoot needs a non-zero runAsUser")
    if uid is not None:
        gid = ctx.get("runAsGroup", uid)
        args += ["--user", f"{uid}:{gid}"]
    if "fsGroup" in pod_ctx:
        args += ["--group-add", str(pod_ctx["fsGroup"])]
    if ctx.get("readOnlyRootFilesystem"):
        # Only the chart's volumes are writable (podman would add tmpfs of its own).
        args += ["--read-only", "--read-only-tmpfs=false"]
    if ctx.get("privileged"):
        args.append("--privileged")
    caps = ctx.get("capabilities", {})
    args += [f"--cap-drop={c}" for c in caps.get("drop", [])]
    args += [f"--cap-add={c}" for c in caps.get("add", [])]
    if ctx.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    seccomp = ctx.get("seccompProfile", {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        raise ChartError(f"{pod.name}: seccompProfile {seccomp} is not translated")
    return args


def volume_args(
    pod: Pod, secret_dirs: dict[str, str], volume_root: Path
) -> tuple[list[str], list[tuple[str, int, int | None, bool]]]:
    """(podman flags for the container's mounts, the host directories to make first)."""
    pod_ctx = pod.workload["spec"]["template"]["spec"].get("securityContext", {})
    fs_group = pod_ctx.get("fsGroup")
    spec = pod.workload["spec"]
    volumes = {v["name"]: v for v in spec["template"]["spec"].get("volumes", [])}
    claims = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
    args: list[str] = []
    dirs: list[tuple[str, int, int | None, bool]] = []
    for mount in pod.container.get("volumeMounts", []):
        name, path = mount["name"], mount["mountPath"]
        ro = ",ro" if mount.get("readOnly") else ""
        if name in claims:
            # A PersistentVolumeClaim <claim>-<pod>: kept when the pod is re-created.
            host = str(volume_root / f"{name}-{pod.name}")
            dirs.append((host, 0o2775 if fs_group is not None else 0o755, fs_group, False))
            args += ["-v", f"{host}:{path}{ro.replace(',', ':')}"]
            continue
        volume = volumes.get(name)
        if volume is None:
            raise ChartError(f"{pod.name}: volumeMount {name} has no volume")
        if "emptyDir" in volume:
            limit = (volume["emptyDir"] or {}).get("sizeLimit")
            if limit or (volume["emptyDir"] or {}).get("medium") == "Memory":
                size = f",size={_quantity_bytes(limit)}" if limit else ""
                args += ["--tmpfs", f"{path}:rw,mode=1777{size}"]
            else:
                host = str(volume_root / f"{pod.name}-{name}")
                dirs.append((host, 0o777, None, True))
                args += ["-v", f"{host}:{path}{ro.replace(',', ':')}"]
        elif "hostPath" in volume:
            host = volume["hostPath"]["path"]
            dirs.append((host, 0o755, None, False))
            args += ["-v", f"{host}:{path}{ro.replace(',', ':')}"]
        elif "secret" in volume:
            secret = volume["secret"]["secretName"]
            if secret not in secret_dirs:
                raise ChartError(f"the chart mounts Secret {secret}: --secret-dir {secret}=DIR")
            args += ["-v", f"{secret_dirs[secret]}:{path}:ro"]
        else:
            raise ChartError(f"{pod.name}: volume {name} ({sorted(volume)}) is not translated")
    return args, dirs


def make_dirs(dirs: list[tuple[str, int, int | None, bool]], *, fresh: bool) -> None:
    """Make the volumes' directories (``fresh``: empty the ones that die with the pod)."""
    for path, mode, group, ephemeral in dirs:
        if fresh and ephemeral:
            shutil.rmtree(path, ignore_errors=True)
        Path(path).mkdir(parents=True, exist_ok=True)
        if group is not None:
            os.chown(path, -1, group)
        os.chmod(path, mode)


def run_argv(
    pod: Pod,
    objects: list[dict[str, Any]],
    *,
    run_id: str,
    secrets: dict[str, dict[str, str]] | None = None,
    secret_dirs: dict[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
    network: str = NETWORK,
    volume_root: Path = ROOT / ".run" / "container-drill" / "volumes",
) -> list[str]:
    """The ``podman run`` command line of one pod, all of it from the rendered chart."""
    container = pod.container
    argv = ["podman", "run", "-d", "--name", pod.name, "--hostname", pod.name]
    argv += ["--network", network, "--ip", pod.ip]
    for alias in pod.aliases:
        argv += ["--network-alias", alias]
    argv += ["--label", f"{LABEL}={run_id}", "--label", f"io.lazarus.component={pod.component}"]
    argv += security_args(pod)
    mounts, pod.host_dirs = volume_args(pod, secret_dirs or {}, volume_root)
    argv += mounts
    env = pod_env(pod, objects, {**chart_secrets(objects), **(secrets or {})})
    if pod.component in ("coordinator", "node-agent"):
        env.update(extra_env or {})
    for name, value in sorted(env.items()):
        argv += ["--env", f"{name}={value}"]
    limits = container.get("resources", {}).get("limits", {})
    if "cpu" in limits:
        argv += ["--cpus", _quantity_cpus(limits["cpu"])]
    if "memory" in limits:
        argv += ["--memory", _quantity_bytes(limits["memory"])]
    grace = pod.workload["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    argv += ["--stop-timeout", str(grace)]
    if "command" in container:
        argv += ["--entrypoint", json.dumps(container["command"])]
    argv.append(container["image"])
    argv += [expand(str(a), env) for a in container.get("args", [])]
    return argv


# --------------------------------------------------------------------- probes


def probe(pod: Pod, which: str = "readinessProbe") -> bool | None:
    """Run the pod's probe once from the host, as the kubelet does (None: no probe)."""
    spec = pod.container.get(which)
    if not spec:
        return None
    ports = {p["name"]: p["containerPort"] for p in pod.container.get("ports", [])}

    def port_of(value: Any) -> int:
        return int(ports[value]) if isinstance(value, str) else int(value)

    timeout_s = float(spec.get("timeoutSeconds", 1))
    try:
        if "grpc" in spec:
            import grpc
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            target = f"{pod.ip}:{port_of(spec['grpc']['port'])}"
            with grpc.insecure_channel(target) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                request = health_pb2.HealthCheckRequest(service=spec["grpc"].get("service", ""))
                reply = stub.Check(request, timeout=timeout_s)
                return reply.status == health_pb2.HealthCheckResponse.SERVING
        if "httpGet" in spec:
            get = spec["httpGet"]
            url = f"http://{pod.ip}:{port_of(get['port'])}{get.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                return 200 <= response.status < 400
        if "tcpSocket" in spec:
            with socket.create_connection(
                (pod.ip, port_of(spec["tcpSocket"]["port"])), timeout=timeout_s
            ):
                return True
        if "exec" in spec:
            done = subprocess.run(
                ["podman", "exec", pod.name, *spec["exec"]["command"]],
                capture_output=True,
                timeout=timeout_s + 5,
                check=False,
            )
            return done.returncode == 0
    except Exception:  # any failure is a failed probe, as for the kubelet
        return False
    raise ChartError(f"{pod.name}: {which} {sorted(spec)} is not translated")


def wait_ready(pods: list[Pod], timeout_s: float = 90.0) -> None:
    """Wait until every pod with a readiness probe passes it.

    Raises:
        TimeoutError: a pod was not ready in time (its log tail is printed).
    """
    deadline = time.monotonic() + timeout_s
    pending = [p for p in pods if p.container.get("readinessProbe")]
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if not probe(p)]
        exited = [p.name for p in pending if not _running(p.name)]
        if exited:
            for name in exited:
                subprocess.run(["podman", "logs", "--tail", "30", name], check=False)
            raise RuntimeError(f"exited before it was ready: {exited}")
        if pending:
            time.sleep(0.5)
    if pending:
        for pod in pending:
            subprocess.run(["podman", "logs", "--tail", "30", pod.name], check=False)
        raise TimeoutError(f"not ready after {timeout_s} s: {[p.name for p in pending]}")


# --------------------------------------------------------- the kubectl stand-in


def deleted_pod(argv: list[str]) -> str | None:
    """The pod of ``kubectl [-n NS] [--context C] delete pod NAME [flags]`` (None: not that)."""
    words: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("-n", "--namespace", "--context"):
            skip = True
        elif not arg.startswith("-"):
            words.append(arg)
    return words[2] if len(words) == 3 and words[:2] == ["delete", "pod"] else None


def kubectl_shim(argv: list[str], state_file: Path) -> int:
    """``kubectl -n NS delete pod NAME --force ...``: SIGKILL and re-create the container."""
    name = deleted_pod(argv)
    if name is None:
        print(f"kubectl stand-in: only `delete pod NAME` is supported, got {argv}", file=sys.stderr)
        return 2
    state = json.loads(state_file.read_text())
    if name not in state["pods"]:
        print(f'Error from server (NotFound): pods "{name}" not found', file=sys.stderr)
        return 1
    subprocess.run(["podman", "kill", "--signal", "KILL", name], capture_output=True, check=False)
    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, check=False)
    make_dirs([tuple(d) for d in state["pods"][name]["host_dirs"]], fresh=True)  # type: ignore[misc]
    log = state_file.parent / "faults.log"
    with log.open("a") as out:
        out.write(f"{time.time():.3f} deleted pod {name} (SIGKILL)\n")
    # The controller re-creates the pod (same name, address and claims) a moment later.
    recreate = (
        f"sleep {state['recreate_after_s']}; "
        f"{shlex.join(state['pods'][name]['argv'])} >/dev/null && "
        f'echo "$(date +%s.%N) re-created pod {name}" >> {shlex.quote(str(log))}'
    )
    subprocess.Popen(
        ["/bin/sh", "-c", recreate],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    print(f'pod "{name}" force deleted')
    return 0


def graceful_stop(pods: list[Pod]) -> int:
    """``podman stop`` each pod (SIGTERM, then SIGKILL after the grace period) and report.

    The process must exit on SIGTERM by itself, well inside its grace period,
    with status 0: as PID 1 it gets no default signal action, only its handler.

    Returns:
        1 when a container needed SIGKILL or exited non-zero, else 0.
    """
    code = 0
    for pod in pods:
        started = time.monotonic()
        _podman("stop", pod.name, check=False)
        took_s = time.monotonic() - started
        status = _podman("inspect", "--format", "{{.State.ExitCode}}", pod.name, check=False)
        exit_code = status.stdout.strip()
        ok = exit_code == "0"
        print(f">> SIGTERM {pod.name}: exited {exit_code} after {took_s:.1f} s", flush=True)
        code |= 0 if ok else 1
    return code


# ------------------------------------------------------------------------ main


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def _running(container: str) -> bool:
    state = _podman("inspect", "--format", "{{.State.Running}}", container, check=False)
    return state.stdout.strip() == "true"


def _exists(container: str) -> bool:
    return _podman("container", "exists", container, check=False).returncode == 0


def _newest_tag(repository: str) -> str:
    out = _podman("images", "--noheading", "--format", "{{.Tag}}", repository).stdout.split()
    tags = [t for t in out if t != "<none>"]
    if not tags:
        raise SystemExit(f"no image {repository}: run `make image` first")
    return tags[0]


def cleanup(volume_root: Path, run_id: str | None = None) -> None:
    """Remove this drill's containers, their volumes' directories and the network."""
    selector = f"label={LABEL}" + (f"={run_id}" if run_id else "")
    names = _podman("ps", "-a", "--filter", selector, "--format", "{{.Names}}").stdout.split()
    if names:
        _podman("rm", "-f", "-t", "0", *names, check=False)
    shutil.rmtree(volume_root, ignore_errors=True)
    _podman("network", "rm", "-f", NETWORK, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True, help="the Lazarus image, repository:tag")
    parser.add_argument("--etcd-image", required=True, help="repository (tag: its newest)")
    parser.add_argument("--redis-image", required=True, help="repository (tag: its newest)")
    parser.add_argument("--set", action="append", default=[], help="chart value a.b=c")
    parser.add_argument("--env", action="append", default=[], help="extra NAME=VALUE")
    parser.add_argument("--secret", action="append", default=[], help="SECRET/KEY=VALUE")
    parser.add_argument("--secret-dir", action="append", default=[], help="SECRET=DIR")
    parser.add_argument("--drill-arg", action="append", default=[], help="to `lazarus drill`")
    parser.add_argument("--scenarios", default="kill-node,kill-leader")
    parser.add_argument("--recreate-after-s", type=float, default=5.0)
    parser.add_argument("--run-dir", type=Path, default=ROOT / ".run" / "container-drill")
    parser.add_argument("--keep", action="store_true", help="leave the containers running")
    parser.add_argument("--print-only", action="store_true", help="print podman commands")
    args = parser.parse_args(argv)

    repository, _, tag = args.image.rpartition(":")
    values: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "etcd": {"image": {"repository": args.etcd_image, "pullPolicy": "Never"}},
        "redis": {"image": {"repository": args.redis_image, "pullPolicy": "Never"}},
        # Plaintext gRPC in the containers: certificates for them are not made
        # here yet (--set tls.existingSecrets.* with --secret-dir to try mTLS).
        "tls": {"enabled": False},
    }
    if not args.print_only:
        values["etcd"]["image"]["tag"] = _newest_tag(args.etcd_image)
        values["redis"]["image"]["tag"] = _newest_tag(args.redis_image)
    for assignment in args.set:
        set_value(values, assignment)
    secrets: dict[str, dict[str, str]] = {}
    for item in args.secret:
        ref, _, value = item.partition("=")
        name, _, key = ref.partition("/")
        secrets.setdefault(name, {})[key] = value
    secret_dirs = dict(item.split("=", 1) for item in args.secret_dir)
    extra_env = dict(item.split("=", 1) for item in args.env)

    run_dir = args.run_dir.resolve()
    volume_root = run_dir / "volumes"
    objects = render_chart(values)
    pods = plan_pods(objects)
    run_id = f"{os.getpid()}"
    for pod in pods:
        pod.run_argv = run_argv(
            pod,
            objects,
            run_id=run_id,
            secrets=secrets,
            secret_dirs=secret_dirs,
            extra_env=extra_env,
            volume_root=volume_root,
        )
    if args.print_only:
        for pod in pods:
            print(shlex.join(pod.run_argv))
        return 0

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "bin").mkdir(exist_ok=True)
    state = {
        "recreate_after_s": args.recreate_after_s,
        "pods": {p.name: {"argv": p.run_argv, "host_dirs": p.host_dirs} for p in pods},
    }
    (run_dir / "state.json").write_text(json.dumps(state, indent=1))
    (run_dir / "faults.log").unlink(missing_ok=True)
    shim = run_dir / "bin" / "kubectl"
    me = shlex.join([sys.executable, str(Path(__file__).resolve())])
    shim.write_text(
        f'#!/bin/sh\nexec {me} kubectl-shim {shlex.quote(str(run_dir / "state.json"))} "$@"\n'
    )
    shim.chmod(0o755)

    cleanup(volume_root)
    _podman("network", "create", "--subnet", SUBNET, NETWORK)
    code = 1
    try:
        started = time.monotonic()
        for group in ("etcd", "redis", "coordinator", "node-agent"):
            members = [p for p in pods if p.component == group]
            for pod in members:
                print(f">> {pod.name} ({pod.ip}): {shlex.join(pod.run_argv[2:])}", flush=True)
                make_dirs(pod.host_dirs, fresh=True)
                subprocess.run(pod.run_argv, check=True, stdout=subprocess.DEVNULL)
            wait_ready(members)
        print(f">> all {len(pods)} pods started and ready in {time.monotonic() - started:.1f} s")
        coordinators = [p for p in pods if p.component == "coordinator"]
        grpc_port = next(
            port["containerPort"]
            for port in coordinators[0].container["ports"]
            if port["name"] == "grpc"
        )
        addresses = ",".join(f"{p.ip}:{grpc_port}" for p in coordinators)
        env = {**os.environ, "PATH": f"{run_dir / 'bin'}:{os.environ['PATH']}"}
        lazarus = str(Path(sys.executable).with_name("lazarus"))
        code = 0
        for scenario in args.scenarios.split(","):
            drill = [
                lazarus, "drill", scenario, "--coordinators", addresses,
                "--kubectl-namespace", NAMESPACE, "--run-dir", str(run_dir / scenario),
                *args.drill_arg,
            ]  # fmt: skip
            print(f">> {shlex.join(drill)}", flush=True)
            code |= subprocess.run(drill, env=env, check=False).returncode
            for pod in pods:  # the re-created pod is back before the next drill
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not _exists(pod.name):
                    time.sleep(0.5)
            wait_ready(pods)
        for pod in pods:
            alive = probe(pod, "livenessProbe")
            if alive is not None:
                print(f">> liveness probe of {pod.name}: {'ok' if alive else 'FAILED'}")
                code |= 0 if alive else 1
        code |= graceful_stop([p for p in pods if p.component in ("coordinator", "node-agent")])
        faults = run_dir / "faults.log"
        print(f">> faults:\n{faults.read_text() if faults.exists() else 'none'}")
    finally:
        if args.keep:
            remove = f"podman rm -f -t 0 $(podman ps -aq --filter label={LABEL})"
            print(f">> containers kept; remove with: {remove}; podman network rm {NETWORK}")
        else:
            for pod in pods:
                with contextlib.suppress(Exception):
                    subprocess.run(
                        ["podman", "logs", pod.name],
                        stdout=(run_dir / f"{pod.name}.log").open("w"),
                        stderr=subprocess.STDOUT,
                        check=False,
                    )
            cleanup(volume_root)
    return code


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "kubectl-shim":
        sys.exit(kubectl_shim(sys.argv[3:], Path(sys.argv[2])))
    sys.exit(main())
