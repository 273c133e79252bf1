"""The ``lazarus`` command line.

Commands are thin: they parse options and call into the package. Heavy imports
happen inside the commands, so ``lazarus --help`` and ``lazarus version`` stay fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from coordinator.core.settings import CoreSettings

app = typer.Typer(
    name="lazarus",
    help="Lazarus: recovery layer for fleets of long-running agent tasks.",
    no_args_is_help=True,
    add_completion=False,
)
demo_app = typer.Typer(
    help="Demonstrations that run on this machine, with real processes and signals.",
    no_args_is_help=True,
)
app.add_typer(demo_app, name="demo")

DurabilityChoice = Literal["sync", "group", "none"]


@app.callback()
def main() -> None:
    """Lazarus: recovery layer for fleets of long-running agent tasks."""


@app.command()
def version() -> None:
    """Print the Lazarus version.

    Example: lazarus version
    """
    from lazarus import __version__

    typer.echo(__version__)


@demo_app.command("checkpoint")
def demo_checkpoint(
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Empty directory for the checkpoint store (default: a fresh temp dir)."),
    ] = None,
    tasks: Annotated[int, typer.Option(min=1, help="Tasks N run side by side.")] = 3,
    items: Annotated[int, typer.Option(min=1, help="Items M per task.")] = 4000,
    every: Annotated[int, typer.Option(min=1, help="Items between checkpoints K.")] = 250,
    durability: Annotated[
        DurabilityChoice, typer.Option(help="Checkpoint store durability mode.")
    ] = "group",
    kills: Annotated[
        int, typer.Option(min=0, help="SIGKILLs of the worker before it finishes.")
    ] = 2,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the kill moments (default: random, printed).")
    ] = None,
    work_ms: Annotated[
        float, typer.Option(min=0.0, help="Simulated work per item, milliseconds.")
    ] = 1.0,
) -> None:
    """Write, SIGKILL, recover, repeat: the checkpoint store under real crashes.

    A worker process runs N tasks, each a SHA-256 hash chain over M items: every
    item is appended to the task's journal, every K items a checkpoint is saved.
    The demo SIGKILLs the worker at seeded random moments, reopens the store,
    prints what each task recovered (newest checkpoint + journal replay), restarts
    the worker, and at the end checks each task's result against a direct
    computation. Exit status 1 when any check fails.

    Example: lazarus demo checkpoint --tasks 3 --items 4000 --every 250 --kills 2 --seed 7
    """
    from lazarus.demo import run_checkpoint_demo

    code = run_checkpoint_demo(data_dir, tasks, items, every, durability, kills, seed, work_ms)
    if code:
        raise typer.Exit(code)


@demo_app.command("fleet")
def demo_fleet(
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Directory for logs and stores (default: a fresh temp dir)."),
    ] = None,
    tasks: Annotated[int, typer.Option(min=1, help="textstats tasks to submit.")] = 60,
    lines: Annotated[int, typer.Option(min=1, max=2000, help="Lines of text per task.")] = 300,
    every: Annotated[int, typer.Option(min=1, help="Lines between checkpoints.")] = 25,
    work_ms: Annotated[
        float, typer.Option(min=0.0, help="Simulated work per line, milliseconds.")
    ] = 10.0,
    kill_after_s: Annotated[
        float, typer.Option(min=0.0, help="Seconds after submission to SIGKILL agent-0.")
    ] = 2.0,
) -> None:
    """A real cluster survives a SIGKILLed node agent, with no task lost or done twice.

    Starts etcd, Redis, 3 coordinators and 3 node agents on this machine, submits
    word/n-gram statistics tasks over public-domain novels, SIGKILLs agent-0
    mid-run, and checks that its tasks moved (epoch + 1), resumed from their
    replicated checkpoints, and that every result equals a direct computation.
    Exit status 1 when any check fails.

    Example: lazarus demo fleet --tasks 60 --kill-after-s 2
    """
    from lazarus.fleetdemo import run_fleet_demo

    code = run_fleet_demo(run_dir, tasks, lines, every, work_ms, kill_after_s)
    if code:
        raise typer.Exit(code)


@app.command()
def drill(
    scenario: Annotated[
        str,
        typer.Argument(
            help="kill-node, kill-leader, partition-heal, etcd-member-loss, redis-restart, or all."
        ),
    ] = "all",
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Directory for logs, stores, report.json, timeline.png (default: temp)."),
    ] = None,
    agents: Annotated[int, typer.Option(min=2, help="Node agents of the local cluster.")] = 4,
    tasks: Annotated[
        int, typer.Option(min=1, help="Workload tasks per drill (default: 3/4 of the slots).")
    ] = 24,
    repeat: Annotated[int, typer.Option(min=1, help="Run the drills this many times.")] = 1,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (for scripts).")
    ] = False,
    coordinators: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_COORDINATORS",
            help="Drill an existing cluster at these addresses (needs --kubectl-namespace).",
        ),
    ] = "",
    kubectl_namespace: Annotated[
        str,
        typer.Option(help="Remote drills: the namespace whose pods kubectl may delete."),
    ] = "",
    kubectl_context: Annotated[
        str, typer.Option(help="Remote drills: kubeconfig context (default: current).")
    ] = "",
) -> None:
    """Inject a real fault into a live cluster, heal, and check nothing was lost.

    Without --coordinators this starts a fresh local cluster (3 etcd members,
    Redis, 3 coordinators, --agents node agents; as root the last agent lives
    in a network namespace so partition-heal is a real partition), submits a
    workload of word/n-gram statistics tasks, injects the fault, heals, waits,
    and reports detection, recovery and failover seconds, tasks moved, forks
    kept, work redone, tasks lost, duplicate completions and wrong results.
    Writes report.json and timeline.png (node states, task moves, the fault
    window) to --run-dir. Exit status 1 when an invariant failed (a task lost,
    completed twice, or a result different from a direct computation).

    With --coordinators the drill runs against an existing cluster (for example
    the Helm release, through kubectl port-forward): faults are made with
    `kubectl delete pod --force` (kill-node deletes the busiest node agent's
    pod, kill-leader the leading coordinator's) and the facts come from
    WatchEvents; partition-heal, etcd-member-loss and redis-restart need a
    network or store fault injector and are reported as skipped.

    Example: lazarus drill kill-node --tasks 24 --run-dir ./drill-run
    """
    import asyncio
    import json
    import sys
    import tempfile

    from rich.console import Console

    from lazarus.drill import (
        SCENARIOS,
        DrillReport,
        make_drill_cluster,
        print_report,
        run_drills,
        write_timeline,
    )

    if coordinators and not kubectl_namespace:
        raise typer.BadParameter(
            "a remote drill makes its faults with kubectl: give --kubectl-namespace (or omit "
            "--coordinators to drill a fresh local cluster)",
            param_hint="--kubectl-namespace",
        )
    if scenario != "all" and scenario not in SCENARIOS:
        raise typer.BadParameter(
            f"{scenario!r}: choose one of {', '.join(SCENARIOS)}, or all", param_hint="SCENARIO"
        )
    scenarios = list(SCENARIOS) if scenario == "all" else [scenario]
    console = Console(stderr=json_output, width=None if sys.stdout.isatty() else 130)
    root = run_dir or Path(tempfile.mkdtemp(prefix="lazarus-drill-"))
    root.mkdir(parents=True, exist_ok=True)
    if coordinators:
        from lazarus.drill_remote import KubectlInjector, RemoteCluster, run_remote_drills
        from node_agent.settings import parse_addresses

        remote = RemoteCluster(parse_addresses(coordinators))
        injector = KubectlInjector(kubectl_namespace, kubectl_context)
        console.print(f"[bold]Lazarus drill[/] {scenario} against {coordinators}")
        remote_results = []
        for _ in range(repeat):
            remote_results += asyncio.run(
                run_remote_drills(remote, injector, scenarios, console=console, tasks=tasks)
            )
        report = DrillReport(remote_results, str(root))
        (root / "report.json").write_text(json.dumps(report.to_json(), indent=2))
        write_timeline(report, root / "timeline.png")
        print_report(report, console)
        if json_output:
            typer.echo(json.dumps(report.to_json(), indent=2))
        if not report.held:
            raise typer.Exit(1)
        return
    console.print(f"[bold]Lazarus drill[/] {scenario} — logs, report and timeline under {root}")
    with console.status("starting 3 etcd members, Redis, 3 coordinators and the node agents"):
        cluster, ns, why = make_drill_cluster(root / "cluster", agents=agents)
    if ns is None:
        console.print(f"[yellow]no network namespaces ({why}): partition-heal pauses a process[/]")
    held = True
    try:
        results = []
        for i in range(repeat):
            if repeat > 1:
                console.print(f"[bold]round {i + 1} of {repeat}[/]")
            results += asyncio.run(
                run_drills(
                    cluster, scenarios, ns=ns, no_ns_reason=why, console=console, tasks=tasks
                )
            )
        report = DrillReport(results, str(root))
        held = report.held
        (root / "report.json").write_text(json.dumps(report.to_json(), indent=2))
        png = write_timeline(report, root / "timeline.png")
        print_report(report, console)
        console.print(f"report: {root / 'report.json'}   timeline: {png}")
        if json_output:
            typer.echo(json.dumps(report.to_json(), indent=2))
    finally:
        with console.status("stopping the cluster"):
            cluster.stop()
            if ns is not None:
                ns.close()
    if not held:
        console.print("[red]an invariant failed[/]: see the notes above and the logs")
        raise typer.Exit(1)


@app.command()
def dev(
    agents: Annotated[int, typer.Option(min=0, help="Node agents running the demo app.")] = 3,
    coordinators_count: Annotated[
        int, typer.Option("--coordinators", min=1, help="Coordinator replicas.")
    ] = 3,
    etcd_members: Annotated[int, typer.Option(help="etcd members: 1 or 3.")] = 1,
    run_dir: Annotated[
        Path | None, typer.Option(help="Directory for every log and store (default: temp).")
    ] = None,
) -> None:
    """A whole cluster on this machine until Ctrl-C: etcd, Redis, coordinators, node agents.

    etcd and redis-server come from PATH (Debian: apt-get install etcd-server
    redis-server). Prints the endpoints, then a live status; every log is under
    --run-dir. Ctrl-C stops everything it started.

    Example: lazarus dev --agents 3   (then, in another shell:
    LAZARUS_COORDINATORS=<printed addresses> lazarus status)
    """
    import asyncio
    import tempfile
    import time

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from lazarus.devcluster import LocalCluster
    from lazarus.localservers import ServerBinaryNotFoundError
    from lazarus.v1 import records_pb2

    console = Console()
    root = run_dir or Path(tempfile.mkdtemp(prefix="lazarus-dev-"))
    cluster = LocalCluster(
        root, coordinators=coordinators_count, agents=agents, etcd_members=etcd_members
    )
    try:
        with console.status("starting etcd, Redis, coordinators and node agents"):
            cluster.start()
            asyncio.run(cluster.ready(60))
    except ServerBinaryNotFoundError as exc:
        cluster.stop()
        console.print(f"[red]{exc}[/]")
        console.print("install them with: sudo apt-get install -y etcd-server redis-server")
        raise typer.Exit(1) from exc
    addresses = ",".join(cluster.coordinator_addresses)
    console.print(f"[bold]Lazarus dev cluster[/] — logs under {root}")
    console.print(f"  coordinators  {addresses}")
    console.print(f"  etcd          {','.join(cluster.etcd_endpoints)}")
    console.print(f"  redis         {cluster.redis_url}")
    console.print(f"  metrics       {' '.join(cluster.coordinator_metrics)}")
    console.print(f"  try:          LAZARUS_COORDINATORS={addresses} lazarus status")

    def status_table() -> Table:
        table = Table(title=f"cluster at {time.strftime('%H:%M:%S')} (Ctrl-C stops it)")
        table.add_column("node")
        table.add_column("state")
        table.add_column("running", justify="right")
        try:
            nodes = asyncio.run(cluster.list_nodes())
            tasks = asyncio.run(cluster.list_tasks())
        except Exception as exc:
            table.add_row("?", f"no answer: {exc}", "")
            return table
        running: dict[str, int] = {}
        done = 0
        for t in tasks:
            if t.state == records_pb2.TASK_STATE_RUNNING:
                running[t.owner_node_id] = running.get(t.owner_node_id, 0) + 1
            elif t.state == records_pb2.TASK_STATE_COMPLETED:
                done += 1
        for n in nodes:
            state = records_pb2.NodeState.Name(n.state).removeprefix("NODE_STATE_")
            table.add_row(n.node_id, state, str(running.get(n.node_id, 0)))
        table.caption = f"{len(tasks)} tasks, {done} completed"
        return table

    try:
        with Live(status_table(), console=console, refresh_per_second=1) as live:
            while True:
                time.sleep(1.0)
                live.update(status_table())
    except KeyboardInterrupt:
        console.print("stopping everything this command started")
    finally:
        cluster.stop()


DetectorChoice = Literal["fixed", "phi"]
_CORE = CoreSettings()
"""Defaults of the coordinator's core options (DESIGN.md §10)."""
LogFormatChoice = Literal["json", "text"]


@app.command()
def coordinator(
    cluster: Annotated[
        str, typer.Option(envvar="LAZARUS_CLUSTER", help="Cluster name (etcd /lazarus/<name>/).")
    ] = "default",
    member_id: Annotated[
        str,
        typer.Option(envvar="LAZARUS_MEMBER_ID", help="This replica's id (default: host-pid)."),
    ] = "",
    listen: Annotated[
        str, typer.Option(envvar="LAZARUS_LISTEN", help="gRPC listen address host:port.")
    ] = "127.0.0.1:7070",
    advertise_address: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_ADVERTISE_ADDRESS",
            help=(
                "Address node agents and peers dial (default: the listen address);"
                " a bare host or IP (a pod IP) gets the listen port."
            ),
        ),
    ] = "",
    etcd_endpoint: Annotated[
        str, typer.Option(envvar="LAZARUS_ETCD_ENDPOINT", help="One etcd member, host:port.")
    ] = "127.0.0.1:2379",
    etcd_timeout_s: Annotated[
        float,
        typer.Option(envvar="LAZARUS_ETCD_TIMEOUT_S", min=0.1, help="Bound on each etcd call."),
    ] = 5.0,
    etcd_username: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_ETCD_USERNAME", help="etcd user (auth enabled); empty: no auth."
        ),
    ] = "",
    etcd_password: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_ETCD_PASSWORD",
            help="etcd password; prefer the variable, from a Secret.",
        ),
    ] = "",
    etcd_ca_file: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_ETCD_CA_FILE", help="CA bundle: talk TLS to etcd, verifying with it."
        ),
    ] = "",
    etcd_cert_file: Annotated[
        str,
        typer.Option(envvar="LAZARUS_ETCD_CERT_FILE", help="Client certificate for etcd (mTLS)."),
    ] = "",
    etcd_key_file: Annotated[
        str,
        typer.Option(envvar="LAZARUS_ETCD_KEY_FILE", help="Private key of --etcd-cert-file."),
    ] = "",
    etcd_token_renewal_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_ETCD_TOKEN_RENEWAL_S",
            min=0.1,
            help="With --etcd-username: re-authenticate this often (below etcd's token TTL).",
        ),
    ] = 60.0,
    lease_ttl_s: Annotated[
        int, typer.Option(envvar="LAZARUS_LEASE_TTL_S", min=1, help="Election lease TTL, seconds.")
    ] = 3,
    metrics_listen: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_METRICS_LISTEN",
            help="Prometheus /metrics address host:port; empty disables.",
        ),
    ] = "127.0.0.1:9464",
    redis_url: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_REDIS_URL", help="Redis of the replicated checkpoints (GetCheckpoint)."
        ),
    ] = "redis://127.0.0.1:6379/0",
    redis_password: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_REDIS_PASSWORD", help="Redis password (AUTH); prefer the variable."
        ),
    ] = "",
    redis_ca_file: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_REDIS_CA_FILE", help="CA bundle for rediss:// (TLS) connections."
        ),
    ] = "",
    heartbeat_interval_s: Annotated[
        float, typer.Option(envvar="LAZARUS_HEARTBEAT_INTERVAL_S", help="Agent heartbeat period.")
    ] = _CORE.heartbeat_interval_s,
    dead_after_s: Annotated[
        float, typer.Option(envvar="LAZARUS_DEAD_AFTER_S", help="Silence until a node is DEAD.")
    ] = _CORE.dead_after_s,
    fence_after_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_FENCE_AFTER_S", help="Agent self-fence after an unacked beat."
        ),
    ] = _CORE.fence_after_s,
    tick_interval_s: Annotated[
        float, typer.Option(envvar="LAZARUS_TICK_INTERVAL_S", help="Core tick cadence.")
    ] = _CORE.tick_interval_s,
    detector: Annotated[
        DetectorChoice,
        typer.Option(envvar="LAZARUS_DETECTOR", help="Suspicion: fixed timeout or phi accrual."),
    ] = _CORE.detector.value,
    suspect_after_intervals: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_SUSPECT_AFTER_INTERVALS", help="Fixed timeout: heartbeats missed."
        ),
    ] = _CORE.suspect_after_intervals,
    phi_threshold: Annotated[
        float, typer.Option(envvar="LAZARUS_PHI_THRESHOLD", help="Phi accrual: suspect at phi.")
    ] = _CORE.phi_threshold,
    phi_window: Annotated[
        int, typer.Option(envvar="LAZARUS_PHI_WINDOW", help="Phi accrual: samples kept.")
    ] = _CORE.phi_window,
    phi_min_std_deviation_s: Annotated[
        float,
        typer.Option(envvar="LAZARUS_PHI_MIN_STD_DEVIATION_S", help="Phi accrual: std floor."),
    ] = _CORE.phi_min_std_deviation_s,
    phi_acceptable_pause_s: Annotated[
        float,
        typer.Option(envvar="LAZARUS_PHI_ACCEPTABLE_PAUSE_S", help="Phi accrual: added pause."),
    ] = _CORE.phi_acceptable_pause_s,
    mass_failure_threshold_ratio: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_MASS_FAILURE_THRESHOLD_RATIO",
            help="Guard engages above this share of nodes dying together.",
        ),
    ] = _CORE.mass_failure_threshold_ratio,
    mass_failure_min_nodes: Annotated[
        int,
        typer.Option(envvar="LAZARUS_MASS_FAILURE_MIN_NODES", help="Guard: smallest population."),
    ] = _CORE.mass_failure_min_nodes,
    mass_failure_window_s: Annotated[
        float,
        typer.Option(envvar="LAZARUS_MASS_FAILURE_WINDOW_S", help="Guard: 'together' window."),
    ] = _CORE.mass_failure_window_s,
    default_max_attempts: Annotated[
        int,
        typer.Option(envvar="LAZARUS_DEFAULT_MAX_ATTEMPTS", help="Attempts when a spec says 0."),
    ] = _CORE.default_max_attempts,
    release_timeout_s: Annotated[
        float,
        typer.Option(envvar="LAZARUS_RELEASE_TIMEOUT_S", help="Drain: time to release a task."),
    ] = _CORE.release_timeout_s,
    max_assignments_per_round: Annotated[
        int,
        typer.Option(
            envvar="LAZARUS_MAX_ASSIGNMENTS_PER_ROUND", help="Placements per step at most."
        ),
    ] = _CORE.max_assignments_per_round,
    seed: Annotated[
        int | None, typer.Option(envvar="LAZARUS_SEED", help="Core random seed (default random).")
    ] = None,
    log_level: Annotated[
        str, typer.Option(envvar="LAZARUS_LOG_LEVEL", help="DEBUG, INFO, WARNING, ERROR.")
    ] = "INFO",
    log_format: Annotated[
        LogFormatChoice, typer.Option(envvar="LAZARUS_LOG_FORMAT", help="json lines or text.")
    ] = "json",
) -> None:
    """Run one coordinator replica: campaign in etcd, serve node Sessions and the API.

    Every replica serves CoordinatorService (followers read their etcd cache and
    proxy writes to the leader); the elected leader also serves node agent
    Sessions, detects dead nodes and moves their tasks. SIGTERM or SIGINT
    resigns leadership at once and exits.

    Example: lazarus coordinator --cluster prod --listen 0.0.0.0:7070
    --advertise-address coord-0.lazarus:7070 --etcd-endpoint etcd:2379
    """
    import ipaddress
    import os
    import socket

    from coordinator.core import DetectorKind, UsageError
    from coordinator.logs import configure_logging
    from coordinator.main import run_coordinator
    from coordinator.server import ServerSettings

    configure_logging(log_level, log_format)
    if advertise_address:  # Kubernetes hands out the pod IP alone (downward API)
        listen_port = listen.rpartition(":")[2]
        try:
            advertised_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = (
                ipaddress.ip_address(advertise_address)
            )
        except ValueError:
            advertised_ip = None
        if isinstance(advertised_ip, ipaddress.IPv6Address):
            advertise_address = f"[{advertise_address}]:{listen_port}"
        elif advertised_ip is not None or ":" not in advertise_address:
            advertise_address = f"{advertise_address}:{listen_port}"
    try:
        core_settings = CoreSettings(
            heartbeat_interval_s=heartbeat_interval_s,
            dead_after_s=dead_after_s,
            fence_after_s=fence_after_s,
            tick_interval_s=tick_interval_s,
            detector=DetectorKind(detector),
            suspect_after_intervals=suspect_after_intervals,
            phi_threshold=phi_threshold,
            phi_window=phi_window,
            phi_min_std_deviation_s=phi_min_std_deviation_s,
            phi_acceptable_pause_s=phi_acceptable_pause_s,
            mass_failure_threshold_ratio=mass_failure_threshold_ratio,
            mass_failure_min_nodes=mass_failure_min_nodes,
            mass_failure_window_s=mass_failure_window_s,
            default_max_attempts=default_max_attempts,
            release_timeout_s=release_timeout_s,
            max_assignments_per_round=max_assignments_per_round,
        )
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        settings = ServerSettings(
            cluster=cluster,
            member_id=member_id or f"{socket.gethostname()}-{os.getpid()}",
            listen=listen,
            advertise_address=advertise_address,
            redis_url=redis_url,
            redis_password=redis_password,
            redis_ca_file=redis_ca_file,
            etcd_endpoint=etcd_endpoint,
            lease_ttl_s=lease_ttl_s,
            etcd_timeout_s=etcd_timeout_s,
            etcd_username=etcd_username,
            etcd_password=etcd_password,
            etcd_ca_file=etcd_ca_file,
            etcd_cert_file=etcd_cert_file,
            etcd_key_file=etcd_key_file,
            etcd_token_renewal_s=etcd_token_renewal_s,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    code = run_coordinator(settings, core_settings, metrics_listen=metrics_listen, seed=seed)
    if code:
        raise typer.Exit(code)


_AGENT_DEFAULTS = {
    "redis_url": "redis://127.0.0.1:6379/0",
    "app": "node_agent.demo_app:agent",
}


@app.command("node-agent")
def node_agent_command(
    node_id: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_NODE_ID",
            help="Stable node name (the pod name in Kubernetes; default: the host name).",
        ),
    ] = "",
    coordinators: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_COORDINATORS",
            help="Coordinator addresses host:port, comma-separated; the leader is found.",
        ),
    ] = "127.0.0.1:7070",
    data_dir: Annotated[
        Path,
        typer.Option(
            envvar="LAZARUS_DATA_DIR", help="Local checkpoint store directory (keep it on restart)."
        ),
    ] = Path("./lazarus-data"),
    redis_url: Annotated[
        str, typer.Option(envvar="LAZARUS_REDIS_URL", help="Redis for replicated checkpoints.")
    ] = _AGENT_DEFAULTS["redis_url"],
    redis_password: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_REDIS_PASSWORD",
            help="Redis password (AUTH); prefer the variable, from a Secret.",
        ),
    ] = "",
    redis_ca_file: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_REDIS_CA_FILE", help="CA bundle for rediss:// (TLS) connections."
        ),
    ] = "",
    app_path: Annotated[
        str,
        typer.Option(
            "--app",
            envvar="LAZARUS_APP",
            help="module:attribute of the Agent whose tasks run here.",
        ),
    ] = _AGENT_DEFAULTS["app"],
    slots: Annotated[
        int, typer.Option(envvar="LAZARUS_SLOTS", min=1, help="Task slots this node offers.")
    ] = 8,
    labels: Annotated[
        str, typer.Option(envvar="LAZARUS_LABELS", help="Node labels key=value,key=value.")
    ] = "",
    advertise_kinds: Annotated[
        bool,
        typer.Option(
            envvar="LAZARUS_ADVERTISE_KINDS",
            help="Tell placement which kinds this app serves (off: unknown kinds fail loudly).",
        ),
    ] = False,
    durability: Annotated[
        Literal["local", "replicated"],
        typer.Option(
            envvar="LAZARUS_DURABILITY",
            help="Default checkpoint durability: after local fsync, or after Redis acked too.",
        ),
    ] = "local",
    max_payload_bytes: Annotated[
        int,
        typer.Option(
            envvar="LAZARUS_MAX_PAYLOAD_BYTES",
            help="Limit on a payload, checkpoint, event or result, bytes.",
        ),
    ] = 1 << 20,
    replication_backlog: Annotated[
        int,
        typer.Option(
            envvar="LAZARUS_REPLICATION_BACKLOG",
            help="Records queued for Redis at most; writers wait beyond it.",
        ),
    ] = 10_000,
    metrics_listen: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_METRICS_LISTEN",
            help="Prometheus /metrics address host:port; empty disables.",
        ),
    ] = "127.0.0.1:9465",
    fence_lead_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_FENCE_LEAD_S",
            help="Start pausing tasks this long before the self-fence deadline.",
        ),
    ] = 0.5,
    log_level: Annotated[
        str, typer.Option(envvar="LAZARUS_LOG_LEVEL", help="DEBUG, INFO, WARNING, ERROR.")
    ] = "INFO",
    log_format: Annotated[
        LogFormatChoice, typer.Option(envvar="LAZARUS_LOG_FORMAT", help="json lines or text.")
    ] = "json",
) -> None:
    """Run one node agent: hold a Session with the leader, run tasks, checkpoint them.

    The agent finds the leader among --coordinators (following NotLeader),
    says Hello with every task its local store still holds, heartbeats, runs the
    tasks the leader assigns with the handlers of --app, checkpoints to SQLite
    in --data-dir and replicates to Redis. Without an ack for a heartbeat it
    self-fences: every task is paused before the leader could give it to another
    node. SIGTERM or SIGINT pauses the tasks, says Goodbye and exits.

    Example: lazarus node-agent --node-id worker-0 --coordinators
    coord-0:7070,coord-1:7070 --data-dir /var/lib/lazarus --redis-url redis://redis:6379/0
    """
    import socket

    from coordinator.logs import configure_logging
    from node_agent.main import run_node_agent
    from node_agent.settings import AgentSettings, SettingsError, parse_addresses, parse_labels

    configure_logging(log_level, log_format)
    try:
        settings = AgentSettings(
            node_id=node_id or socket.gethostname(),
            coordinators=parse_addresses(coordinators),
            data_dir=data_dir,
            redis_url=redis_url,
            redis_password=redis_password,
            redis_ca_file=redis_ca_file,
            app=app_path,
            slots=slots,
            labels=parse_labels(labels),
            advertise_kinds=advertise_kinds,
            durability=durability,
            max_payload_bytes=max_payload_bytes,
            replication_backlog=replication_backlog,
            metrics_listen=metrics_listen,
            fence_lead_s=fence_lead_s,
        )
    except SettingsError as exc:
        raise typer.BadParameter(str(exc)) from exc
    code = run_node_agent(settings)
    if code:
        raise typer.Exit(code)
