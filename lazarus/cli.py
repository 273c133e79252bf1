"""The ``lazarus`` command line.

Commands are thin: they parse options and call into the package. Heavy imports
happen inside the commands, so ``lazarus --help`` and ``lazarus version`` stay fast.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

import typer

from coordinator.core.settings import CoreSettings
from lazarus.certs_cli import certs_app

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
app.add_typer(certs_app, name="certs")

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
            help="kill-node, kill-leader, partition-heal, etcd-member-loss, redis-restart, "
            "redis-loss, duplicate-identity, complete-failure, chaos, a comma-separated list, "
            "or all."
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
    seed: Annotated[int, typer.Option(help="chaos: the schedule's seed (replays a run).")] = 1,
    seeds: Annotated[
        int, typer.Option(min=1, help="chaos: run this many seeds, --seed, --seed+1, ...")
    ] = 1,
    duration: Annotated[
        float, typer.Option(min=5.0, help="chaos: seconds of faults per seed.")
    ] = 60.0,
    netns: Annotated[
        bool,
        typer.Option(
            help="As root, put the last agent in a network namespace (real partitions); "
            "--no-netns pauses a process instead."
        ),
    ] = True,
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
    WatchEvents; partition-heal, etcd-member-loss, redis-restart and
    redis-loss need a network or store fault injector and are reported as
    skipped.

    Safety is judged from the tasks' own side effects (every step start and
    executed completion, with pid and epoch): one process per task and epoch,
    epochs rising, no old-epoch step after a newer one began, one executed
    completion per task (dup exec), no acknowledged checkpoint lost.

    chaos runs a seeded random schedule of overlapping faults (SIGKILL/SIGSTOP
    of agents, the leader, an etcd member, Redis; a partition; restarts with
    the same data dir) for --duration seconds, then heals and checks; the
    seed and schedule are printed and kept in report.json, so a failure
    replays with --seed. Operators: lazarus drill chaos --seeds 20.

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
    scenarios = list(SCENARIOS) if scenario == "all" else scenario.split(",")
    for name in scenarios:
        if name not in SCENARIOS:
            raise typer.BadParameter(
                f"{name!r}: choose one of {', '.join(SCENARIOS)}, a comma-separated list, or all",
                param_hint="SCENARIO",
            )
    console = Console(stderr=json_output, width=None if sys.stdout.isatty() else 190)
    root = (run_dir or Path(tempfile.mkdtemp(prefix="lazarus-drill-"))).resolve()
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
        report = DrillReport(remote_results, str(root), mtls=remote.client_tls.enabled)
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
        cluster, ns, why = make_drill_cluster(root / "cluster", agents=agents, use_netns=netns)
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
                    cluster,
                    scenarios,
                    ns=ns,
                    no_ns_reason=why,
                    console=console,
                    tasks=tasks,
                    chaos_seeds=tuple(range(seed, seed + seeds)),
                    chaos_s=duration,
                )
            )
        report = DrillReport(results, str(root), mtls=cluster.mtls)
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
    env_file = root / "tls" / "admin.env"  # the admin client's LAZARUS_TLS_* variables
    env_file.write_text("".join(f"export {k}={v}\n" for k, v in cluster.client_env().items()))
    console.print(f"  security      mTLS on; CA and certificates in {root / 'tls'}")
    console.print(f"  as admin:     . {env_file}")
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


TlsCaOption = Annotated[
    str,
    typer.Option(
        envvar="LAZARUS_TLS_CA_FILE", help="Cluster CA bundle verifying the coordinators (TLS)."
    ),
]
TlsCertOption = Annotated[
    str, typer.Option(envvar="LAZARUS_TLS_CERT_FILE", help="This process's certificate (mTLS).")
]
TlsKeyOption = Annotated[
    str, typer.Option(envvar="LAZARUS_TLS_KEY_FILE", help="Private key of --tls-cert-file.")
]
TlsServerNameOption = Annotated[
    str,
    typer.Option(
        envvar="LAZARUS_TLS_SERVER_NAME",
        help="Name to verify in coordinators' certificates (default: the dialled host).",
    ),
]


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
    etcd_endpoints: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_ETCD_ENDPOINTS",
            help=(
                "Every etcd member, host:port,host:port (overrides --etcd-endpoint);"
                " the client moves off a failed member keeping lease and leadership."
            ),
        ),
    ] = "",
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
    failover_reconnect_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_FAILOVER_RECONNECT_S",
            min=0.0,
            help="A new leader's extra grace beyond dead_after for nodes to reconnect.",
        ),
    ] = 7.0,
    loop_lag_resign_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_LOOP_LAG_RESIGN_S",
            min=0.6,
            help="Resign leadership when the event loop lags this long, seconds.",
        ),
    ] = 5.0,
    hello_rate_per_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_HELLO_RATE_PER_S",
            min=1.0,
            help="Session Hellos admitted per second past the burst; others retry later.",
        ),
    ] = 500.0,
    max_sessions: Annotated[
        int,
        typer.Option(envvar="LAZARUS_MAX_SESSIONS", min=1, help="Open Sessions per replica."),
    ] = 20_000,
    defer_hellos_above_cpu: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_DEFER_HELLOS_ABOVE_CPU",
            min=0.05,
            help="Admit no Session Hello while this process used this many cores over the last "
            "second (a saturated leader starves its lease keepalive); they retry later.",
        ),
    ] = 0.85,
    max_concurrent_rpcs: Annotated[
        int,
        typer.Option(
            envvar="LAZARUS_MAX_CONCURRENT_RPCS",
            min=1,
            help="Orchestrator RPCs served at once; more answer RESOURCE_EXHAUSTED.",
        ),
    ] = 64,
    retention_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_RETENTION_S",
            help="Seconds a finished task or LEFT node stays in etcd before the Redis archive.",
        ),
    ] = _CORE.retention_s,
    seed: Annotated[
        int | None, typer.Option(envvar="LAZARUS_SEED", help="Core random seed (default random).")
    ] = None,
    auth: Annotated[
        Literal["mtls", "none"],
        typer.Option(
            envvar="LAZARUS_AUTH",
            help="mtls: TLS + client certificates/tokens + roles; none: plaintext, local only.",
        ),
    ] = "mtls",
    tls_cert_file: TlsCertOption = "",
    tls_key_file: TlsKeyOption = "",
    tls_client_ca_file: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_TLS_CLIENT_CA_FILE", help="CA bundle verifying peers' certificates."
        ),
    ] = "",
    tls_server_name: TlsServerNameOption = "",
    auth_token_file: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_AUTH_TOKEN_FILE",
            help="Hashed bearer tokens 'sha256:<hex> name role' a line (reloaded on change).",
        ),
    ] = "",
    token_listen: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_TOKEN_LISTEN",
            help="Second host:port: TLS without client certificates, for bearer-token clients.",
        ),
    ] = "",
    reflection: Annotated[
        bool, typer.Option(envvar="LAZARUS_REFLECTION", help="Serve gRPC server reflection.")
    ] = True,
    health_listen: Annotated[
        str,
        typer.Option(
            envvar="LAZARUS_HEALTH_LISTEN",
            help="Plaintext host:port serving only grpc.health.v1 (probes without TLS).",
        ),
    ] = "",
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
    from coordinator.core.admission import AdmissionSettings
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
            failover_reconnect_s=failover_reconnect_s,
            retention_s=retention_s,
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
            etcd_endpoints=tuple(e.strip() for e in etcd_endpoints.split(",") if e.strip()),
            lease_ttl_s=lease_ttl_s,
            etcd_timeout_s=etcd_timeout_s,
            etcd_username=etcd_username,
            etcd_password=etcd_password,
            etcd_ca_file=etcd_ca_file,
            etcd_cert_file=etcd_cert_file,
            etcd_key_file=etcd_key_file,
            etcd_token_renewal_s=etcd_token_renewal_s,
            auth=auth,
            tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
            tls_client_ca_file=tls_client_ca_file,
            tls_server_name=tls_server_name,
            auth_token_file=auth_token_file,
            token_listen=token_listen,
            reflection=reflection,
            health_listen=health_listen,
            loop_lag_resign_s=loop_lag_resign_s,
            admission=AdmissionSettings(
                hello_rate_per_s=hello_rate_per_s,
                hello_burst=max(1, int(hello_rate_per_s)),
                max_sessions=max_sessions,
                max_concurrent_rpcs=max_concurrent_rpcs,
                defer_hellos_above_cpu=defer_hellos_above_cpu,
            ),
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
    isolation: Annotated[
        Literal["thread", "process"],
        typer.Option(
            envvar="LAZARUS_ISOLATION",
            help="Where plain def handlers run unless they say: a thread of the agent "
            "(I/O-bound steps) or a worker process per slot (CPU-bound Python).",
        ),
    ] = "thread",
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
    tls_ca_file: TlsCaOption = "",
    tls_cert_file: TlsCertOption = "",
    tls_key_file: TlsKeyOption = "",
    tls_server_name: TlsServerNameOption = "",
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
    from lazarus.tls import ClientTls
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
            isolation=isolation,
            max_payload_bytes=max_payload_bytes,
            replication_backlog=replication_backlog,
            metrics_listen=metrics_listen,
            fence_lead_s=fence_lead_s,
            tls=ClientTls(tls_ca_file, tls_cert_file, tls_key_file, tls_server_name),
        )
    except (SettingsError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    code = run_node_agent(settings)
    if code:
        raise typer.Exit(code)


# ---------------------------------------------------------------- operator commands
#
# status, nodes, tasks, task, submit, cancel, drain, uncordon, migrate, watch:
# thin shells over ``lazarus.client.Client``. Each takes --coordinators (any
# replica answers) and --json; people get rich tables on stdout, errors on
# stderr with what to do next. Exit status: 0 done, 1 the coordinator refused
# the request, 2 bad usage, 3 no coordinator could answer.

CoordinatorsOption = Annotated[
    str,
    typer.Option(
        "--coordinators",
        envvar="LAZARUS_COORDINATORS",
        help="Coordinator addresses host:port, comma-separated; any replica answers.",
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON document for scripts (proto3 JSON mapping, defaults included).",
    ),
]
DEFAULT_COORDINATORS = "127.0.0.1:7070"
_R = TypeVar("_R")
OPERATOR_TIMEOUT_S = 5.0
"""Deadline of each call an operator command makes, seconds."""
OPERATOR_RETRY_S = 4.0
"""How long an operator command keeps retrying unreachable coordinators, seconds."""
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
_STATE_STYLES = {
    "RUNNING": "green",
    "ASSIGNED": "cyan",
    "PENDING": "yellow",
    "COMPLETED": "blue",
    "FAILED": "red",
    "CANCELLED": "dim",
    "ALIVE": "green",
    "SUSPECT": "yellow",
    "DEAD": "red",
    "DRAINING": "magenta",
    "LEFT": "dim",
}


def make_operator_client(addresses: str) -> Any:
    """The ``lazarus.client.Client`` operator commands use (unit tests swap in a fake).

    Raises:
        ValueError: a malformed address list.
    """
    from lazarus.client import Client

    return Client(addresses, timeout_s=OPERATOR_TIMEOUT_S, retry_max_s=OPERATOR_RETRY_S)


def _console(*, stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def _fail(json_output: bool, error: dict[str, str], headline: str, exit_code: int) -> NoReturn:
    """Report a failed call (JSON document on stdout, or text on stderr) and exit."""
    import json

    if json_output:
        typer.echo(json.dumps({"error": error}, indent=2))
    else:
        err = _console(stderr=True)
        err.print(f"[red]error[/]: {escape_markup(headline)}")
        if headline == error["hint"]:  # unreachable: the advice first, the cause after
            detail = f"({error['code']}: {error['message']})"
        else:
            detail = error["hint"]
        if detail:
            err.print(f"  {escape_markup(detail)}")
    raise typer.Exit(exit_code)


def escape_markup(text: str) -> str:
    """``text`` with rich markup escaped."""
    from rich.markup import escape

    return escape(text)


def _hint(exc: Any, coordinators: str, not_found: str) -> tuple[str, str, int]:
    """(headline for people, what to do, exit status) for a LazarusError."""
    from lazarus.client import DeadlineExceeded, Unavailable

    where = coordinators or "(none given)"
    plain = f"{exc.code.name}: {exc.message}"
    if isinstance(exc, Unavailable):
        if not exc.answered:
            hint = (
                f"no coordinator answered at {where} — is `lazarus coordinator` running? "
                "set --coordinators (or LAZARUS_COORDINATORS) to its host:port list"
            )
            return hint, hint, EXIT_UNREACHABLE
        hint = (
            f"the coordinators at {where} answered but could not serve the call — is a leader "
            "elected and etcd reachable? see `lazarus status` and the coordinator logs"
        )
        return hint, hint, EXIT_UNREACHABLE
    if isinstance(exc, DeadlineExceeded):
        hint = (
            f"no answer in time from {where}; a write may still have been applied — check "
            "with `lazarus task <id>` / `lazarus nodes` before repeating it"
        )
        return hint, hint, EXIT_UNREACHABLE
    name = exc.code.name
    if name == "INVALID_ARGUMENT":
        return plain, f"fix {exc.field or 'the request'} and try again", EXIT_REFUSED
    if name == "NOT_FOUND":
        return plain, not_found, EXIT_REFUSED
    if name == "UNIMPLEMENTED":
        return plain, "the coordinators do not serve this call yet; upgrade them", EXIT_REFUSED
    return plain, "", EXIT_REFUSED


def _run_operator(
    coordinators: str,
    json_output: bool,
    work: Callable[[Any], Awaitable[_R]],
    *,
    not_found: str = "",
) -> _R:
    """Run ``work(client)`` on a fresh client; turn a LazarusError into a message and exit code."""
    import asyncio

    from lazarus.client import LazarusError

    try:
        client = make_operator_client(coordinators)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--coordinators") from exc

    async def session() -> _R:
        async with client:
            return await work(client)

    try:
        return asyncio.run(session())
    except LazarusError as exc:
        headline, hint, exit_code = _hint(exc, coordinators, not_found)
        error = {"code": exc.code.name, "message": exc.message, "hint": hint}
        if exc.field:
            error["field"] = exc.field
        _fail(json_output, error, headline, exit_code)


def _as_json(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    doc: dict[str, Any] = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return doc


def _print_json(doc: Any) -> None:
    import json

    typer.echo(json.dumps(doc, indent=2))


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def _styled(name: str) -> str:
    style = _STATE_STYLES.get(name)
    return f"[{style}]{name}[/]" if style else name


def _task_state(value: int) -> str:
    from lazarus.v1 import records_pb2

    return _enum_name(records_pb2.TaskState, value, "TASK_STATE_")


def _node_state(value: int) -> str:
    from lazarus.v1 import records_pb2

    return _enum_name(records_pb2.NodeState, value, "NODE_STATE_")


def _ago(unix_ms: int, now_ms: int | None = None) -> str:
    import time

    if unix_ms <= 0:
        return "—"
    now = int(time.time() * 1000) if now_ms is None else now_ms
    seconds = max(0, now - unix_ms) // 1000
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    if seconds < 172800:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"


def _utc(unix_ms: int) -> str:
    import datetime

    if unix_ms <= 0:
        return "—"
    moment = datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: want key=value", param_hint=option)
        out[key] = value
    return out


def _split(values: list[str] | None) -> list[str]:
    return [part.strip() for v in values or [] for part in v.split(",") if part.strip()]


def _states(values: list[str] | None, parse: Callable[[str, str], int]) -> list[int]:
    from lazarus.client import InvalidArgument

    out = []
    for value in _split(values):
        try:
            out.append(parse(value, "--state"))
        except InvalidArgument as exc:
            raise typer.BadParameter(exc.message.partition(": ")[2], param_hint="--state") from exc
    return out


@app.command()
def status(
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS, json_output: JsonOption = False
) -> None:
    """Show the cluster: leader, term, members, and node and task counts by state.

    --json prints the GetClusterStatusResponse (cluster_name, leader_id,
    leader_address, term, members, serving_member_id, nodes_by_state,
    tasks_by_state, mass_failure_guard_active, read_revision, now_unix_ms).

    Example: lazarus status --coordinators coord-0:7070,coord-1:7070,coord-2:7070
    """
    from rich.table import Table

    reply = _run_operator(coordinators, json_output, lambda c: c.status())
    if json_output:
        _print_json(_as_json(reply))
        return
    out = _console()
    table = Table(title=f"cluster {reply.cluster_name}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    leader = reply.leader_address or "[red]none known[/]"
    if reply.leader_id:
        leader = f"{reply.leader_id} at {leader}"
    table.add_row("leader", leader)
    table.add_row("term", str(reply.term))
    table.add_row("answered by", reply.serving_member_id or "?")
    nodes = " · ".join(f"{_styled(_node_state(c.state))} {c.count}" for c in reply.nodes_by_state)
    tasks = " · ".join(f"{_styled(_task_state(c.state))} {c.count}" for c in reply.tasks_by_state)
    table.add_row("nodes", nodes or "none")
    table.add_row("tasks", tasks or "none")
    guard = "[red]ACTIVE: redistribution stopped[/]" if reply.mass_failure_guard_active else "off"
    table.add_row("mass-failure guard", guard)
    table.add_row("read revision", str(reply.read_revision))
    if reply.members:
        members = ", ".join(f"{m.member_id} ({m.address})" for m in reply.members)
        table.add_row("members", members)
    for q in reply.quarantined:
        table.add_row("[red]quarantined[/]", f"{q.collection}/{q.name}: {q.reason}")
    out.print(table)


@app.command()
def nodes(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            help=(
                "Only nodes in this state (alive, suspect, dead, draining, left);"
                " repeat or comma-separate."
            ),
        ),
    ] = None,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """List node agents: state, cordon, Session, tasks, load, last heartbeat.

    Liveness (connected, heartbeat, load) is known only to the leader: a
    follower answers with the stored records. --json prints
    {"nodes": [NodeInfo, ...]} (each with "record" and, from the leader,
    "liveness").

    Example: lazarus nodes --state alive,draining
    """
    from rich.table import Table

    from lazarus.client import node_state_value

    states = _states(state, node_state_value)
    infos = _run_operator(coordinators, json_output, lambda c: c.nodes(states=states))
    if json_output:
        _print_json({"nodes": [_as_json(i) for i in infos]})
        return
    out = _console()
    table = Table(title=f"{len(infos)} node(s)", title_justify="left")
    for column in (
        "node",
        "state",
        "cordoned",
        "session",
        "tasks",
        "slots used",
        "heartbeat",
        "address",
    ):
        table.add_column(column, justify="right" if column in ("tasks", "slots used") else "left")
    live_known = False
    for info in infos:
        record = info.record
        has = info.HasField("liveness")
        live_known = live_known or has
        live = info.liveness
        table.add_row(
            record.node_id,
            _styled(_node_state(record.state)),
            "[magenta]yes[/]" if record.cordoned else "no",
            ("open" if live.connected else "[red]closed[/]") if has else "—",
            str(live.assigned_tasks) if has else "—",
            f"{live.load.used_slots}/{record.capacity.slots}"
            if has
            else f"?/{record.capacity.slots}",
            _ago(live.last_heartbeat_at_unix_ms if has else record.last_heartbeat_at_unix_ms),
            record.address or "—",
        )
    if infos and not live_known:
        table.caption = "a follower answered: liveness figures come only from the leader"
    out.print(table)


@app.command()
def tasks(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            help=(
                "Only tasks in this state (pending, assigned, running, completed, failed,"
                " cancelled); repeat or comma-separate."
            ),
        ),
    ] = None,
    node: Annotated[str, typer.Option("--node", help="Only tasks owned by this node.")] = "",
    kind: Annotated[str, typer.Option("--kind", help="Only tasks of this kind.")] = "",
    label: Annotated[
        list[str] | None,
        typer.Option("--label", help="Only tasks with this label key=value; repeatable."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=0, help="Show at most this many; 0 = all.")
    ] = 50,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """List tasks, ordered by id, with state, owner, epoch and checkpoints.

    --json prints {"tasks": [TaskRecord, ...], "count": N, "truncated": bool}
    (truncated: more tasks match than --limit).

    Example: lazarus tasks --state running --node worker-0 --limit 20
    """
    from rich.markup import escape
    from rich.table import Table

    from lazarus.client import task_state_value

    states = _states(state, task_state_value)
    labels = _pairs(label, "--label")
    records = _run_operator(
        coordinators,
        json_output,
        lambda c: c.tasks(
            states=states,
            node_id=node,
            kind=kind,
            labels=labels,
            limit=(limit + 1) if limit else None,
        ),
    )
    truncated = bool(limit) and len(records) > limit
    records = records[:limit] if limit else records
    if json_output:
        _print_json(
            {"tasks": [_as_json(t) for t in records], "count": len(records), "truncated": truncated}
        )
        return
    out = _console()
    table = Table(title=f"{len(records)} task(s)", title_justify="left")
    for column in (
        "task",
        "kind",
        "state",
        "node",
        "epoch",
        "attempt",
        "checkpoint",
        "updated",
        "note",
    ):
        table.add_column(column, justify="right" if column in ("epoch", "attempt") else "left")
    for t in records:
        checkpoint = "—"
        if t.last_checkpoint.seq:
            checkpoint = f"#{t.last_checkpoint.seq}"
            if t.last_replicated_checkpoint.seq != t.last_checkpoint.seq:
                checkpoint += f" (#{t.last_replicated_checkpoint.seq} in Redis)"
        note = ""
        if t.HasField("move"):
            note = f"moving → {t.move.target_node_id or 'any'}"
        elif t.HasField("last_error"):
            note = t.last_error.message.splitlines()[0][:60] if t.last_error.message else ""
        table.add_row(
            t.task_id,
            t.spec.kind,
            _styled(_task_state(t.state)),
            t.owner_node_id or "—",
            str(t.epoch),
            str(t.attempt),
            checkpoint,
            _ago(t.updated_at_unix_ms),
            escape(note),
        )
    if truncated:
        table.caption = "more tasks match: raise --limit (0 = all)"
    out.print(table)


@app.command()
def task(
    task_id: Annotated[str, typer.Argument(help="The task id.")],
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Show one task: spec, state, owner, checkpoints, result, last error, move and forks.

    --json prints the GetTaskResponse: {"task": TaskRecord, "forks":
    [ForkRecord, ...], "read_revision": "..."}.

    Example: lazarus task task-3798de419cd70d9f
    """
    from rich.markup import escape
    from rich.table import Table

    from lazarus.v1 import records_pb2

    reply = _run_operator(
        coordinators,
        json_output,
        lambda c: c.get(task_id),
        not_found="list the tasks with `lazarus tasks`",
    )
    if json_output:
        _print_json(_as_json(reply))
        return
    t = reply.task
    out = _console()
    table = Table(title=f"task {t.task_id}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("kind", t.spec.kind)
    table.add_row("state", _styled(_task_state(t.state)))
    table.add_row("owner", t.owner_node_id or "—")
    table.add_row(
        "epoch / attempt", f"{t.epoch} / {t.attempt} of {t.spec.max_attempts or 'default'}"
    )
    table.add_row("request id", escape(t.request_id))
    table.add_row("submitted", _utc(t.submitted_at_unix_ms))
    table.add_row("started", _utc(t.started_at_unix_ms))
    table.add_row("finished", _utc(t.finished_at_unix_ms))
    if t.last_checkpoint.seq:
        table.add_row(
            "last checkpoint",
            f"{t.last_checkpoint.checkpoint_ref}"
            f" (journal ≤ {t.last_checkpoint.covers_journal_seq})",
        )
    if t.last_replicated_checkpoint.seq:
        table.add_row(
            "in Redis",
            f"{t.last_replicated_checkpoint.checkpoint_ref},"
            f" journal to {t.last_replicated_journal_seq}",
        )
    if t.previous_owner_node_ids:
        table.add_row("previous owners", ", ".join(t.previous_owner_node_ids))
    if t.HasField("move"):
        reason = _enum_name(records_pb2.MoveReason, t.move.reason, "MOVE_REASON_")
        table.add_row(
            "moving",
            f"{reason} → {t.move.target_node_id or 'placement chooses'} (move {t.move.move_id})",
        )
    if t.cancel_reason:
        table.add_row("cancel reason", escape(t.cancel_reason))
    if t.forked_from_ref:
        table.add_row("forked from", t.forked_from_ref)
    if t.HasField("result"):
        preview = bytes(t.result.payload[:200]).decode("utf-8", "replace")
        more = "…" if t.result.size_bytes > 200 else ""
        table.add_row("result", escape(f"{t.result.size_bytes} bytes: {preview}{more}"))
    if t.HasField("last_error"):
        e = t.last_error
        code = _enum_name(records_pb2.TaskErrorCode, e.code, "TASK_ERROR_CODE_")
        where = f" on {e.node_id}" if e.node_id else ""
        table.add_row(
            "last error",
            escape(f"{code}{where} (attempt {e.attempt}, epoch {e.epoch}): {e.message}"),
        )
    table.add_row("forks", str(len(reply.forks) or t.fork_count))
    out.print(table)
    if reply.forks:
        forks = Table(title="zombie lineages kept as forks", title_justify="left")
        for column in ("fork", "node", "stale epoch", "lineage task", "resolution", "divergent"):
            forks.add_column(column)
        for f in reply.forks:
            forks.add_row(
                f.fork_id,
                f.node_id,
                str(f.stale_epoch),
                f.lineage_task_id,
                _enum_name(records_pb2.ForkResolution, f.resolution, "FORK_RESOLUTION_"),
                f"{f.divergent_checkpoints} checkpoint(s), {f.divergent_journal_events} event(s)",
            )
        out.print(forks)


@app.command()
def submit(
    kind: Annotated[
        str, typer.Argument(help="Task kind (a handler name of the node agents' app).")
    ],
    payload: Annotated[
        str | None, typer.Option("--payload", help="Payload as JSON text (default: {}).")
    ] = None,
    payload_file: Annotated[
        Path | None,
        typer.Option(
            "--payload-file", help="Read the payload from this file (- = stdin); sent as is."
        ),
    ] = None,
    request_id: Annotated[
        str,
        typer.Option(
            "--request-id",
            help="Idempotency key; repeat it to retry safely (default: new, printed).",
        ),
    ] = "",
    task_id: Annotated[
        str, typer.Option("--task-id", help="Task id to use (default: generated).")
    ] = "",
    max_attempts: Annotated[
        int,
        typer.Option("--max-attempts", min=0, help="Attempts before FAILED; 0 = cluster default."),
    ] = 0,
    durability: Annotated[
        Literal["default", "local", "replicated"],
        typer.Option(
            "--durability",
            help="When checkpoint calls return: after local fsync, or after Redis acked.",
        ),
    ] = "default",
    priority: Annotated[
        int, typer.Option("--priority", help="Placement priority; higher first.")
    ] = 0,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Task label key=value; repeatable.")
    ] = None,
    node_selector: Annotated[
        list[str] | None,
        typer.Option("--node-selector", help="Node label key=value the task needs; repeatable."),
    ] = None,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Submit a task; idempotent on --request-id.

    --json prints the SubmitTaskResponse: {"task": TaskRecord, "created": bool}
    ("created" is false, or absent in the proto3 JSON mapping, when the request
    id was used before and the existing task is returned).

    Example: lazarus submit sleep --payload '{"seconds": 30, "checkpoints": 10}' --max-attempts 3
    """
    import json
    import sys
    import uuid

    if payload is not None and payload_file is not None:
        raise typer.BadParameter(
            "give --payload or --payload-file, not both", param_hint="--payload"
        )
    content_type = "application/json"
    if payload_file is not None:
        try:
            data = (
                sys.stdin.buffer.read() if str(payload_file) == "-" else payload_file.read_bytes()
            )
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot read {payload_file}: {exc.strerror}", param_hint="--payload-file"
            ) from exc
        try:
            json.loads(data)
        except ValueError:
            content_type = ""
    else:
        text = "{}" if payload is None else payload
        try:
            json.loads(text)
        except ValueError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="--payload") from exc
        data = text.encode()
    rid = request_id or f"cli-{uuid.uuid4().hex}"
    spec: dict[str, Any] = {
        "max_attempts": max_attempts,
        "priority": priority,
        "labels": _pairs(label, "--label"),
        "node_selector": _pairs(node_selector, "--node-selector"),
        "content_type": content_type,
    }
    if durability != "default":
        spec["durability"] = durability
    reply = _run_operator(
        coordinators,
        json_output,
        lambda c: c.submit(kind, data, request_id=rid, task_id=task_id, **spec),
    )
    if json_output:
        _print_json(_as_json(reply))
        return
    out = _console()
    t = reply.task
    if reply.created:
        out.print(
            f"submitted [bold]{t.task_id}[/] (kind {t.spec.kind},"
            f" {_styled(_task_state(t.state))}); request id {rid}"
        )
    else:
        out.print(
            f"request id {rid} was used before: it is task [bold]{t.task_id}[/] "
            f"({_styled(_task_state(t.state))}); nothing new was submitted"
        )
    out.print(
        f"  follow it: lazarus task {t.task_id}   or   lazarus watch --task {t.task_id}",
        markup=False,
    )


@app.command()
def cancel(
    task_id: Annotated[str, typer.Argument(help="The task id.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why, for the record and the event.")
    ] = "",
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Cancel a task: it becomes CANCELLED and its owner stops it. Idempotent.

    --json prints {"task": TaskRecord} after the cancellation.

    Example: lazarus cancel task-3798de419cd70d9f --reason "wrong input"
    """
    record = _run_operator(
        coordinators,
        json_output,
        lambda c: c.cancel(task_id, reason),
        not_found="list the tasks with `lazarus tasks`",
    )
    if json_output:
        _print_json({"task": _as_json(record)})
        return
    _console().print(f"task [bold]{record.task_id}[/] is {_styled(_task_state(record.state))}")


@app.command()
def drain(
    node_id: Annotated[str, typer.Argument(help="The node to drain.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why, for the record and the events.")
    ] = "",
    release_timeout_s: Annotated[
        float,
        typer.Option(
            "--release-timeout-s",
            min=0.0,
            help="Seconds each task gets to release; 0 = cluster default.",
        ),
    ] = 0.0,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Cordon a node and move each of its tasks elsewhere with no work redone.

    Idempotent while the drain runs; `lazarus uncordon` ends it. --json prints
    the DrainNodeResponse: {"node": NodeRecord, "drain_id": "...",
    "tasks_to_move": N}.

    Example: lazarus drain worker-3 --reason "kernel upgrade"
    """
    reply = _run_operator(
        coordinators,
        json_output,
        lambda c: c.drain(node_id, reason, release_timeout_s),
        not_found="list the nodes with `lazarus nodes`",
    )
    if json_output:
        _print_json(_as_json(reply))
        return
    out = _console()
    out.print(
        f"draining [bold]{reply.node.node_id}[/] (drain {reply.drain_id}): "
        f"{reply.tasks_to_move} task(s) to move; it gets no new tasks"
    )
    out.print(
        f"  follow: lazarus watch --node {node_id}   end it: lazarus uncordon {node_id}",
        markup=False,
    )


@app.command()
def uncordon(
    node_id: Annotated[str, typer.Argument(help="The node.")],
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Lift a node's cordon (ends a drain; tasks already moved stay where they are).

    --json prints {"node": NodeRecord}.

    Example: lazarus uncordon worker-3
    """
    record = _run_operator(
        coordinators,
        json_output,
        lambda c: c.uncordon(node_id),
        not_found="list the nodes with `lazarus nodes`",
    )
    if json_output:
        _print_json({"node": _as_json(record)})
        return
    _console().print(
        f"[bold]{record.node_id}[/] is {_styled(_node_state(record.state))}, "
        f"{'still cordoned' if record.cordoned else 'not cordoned'}: it takes new tasks again"
    )


@app.command()
def migrate(
    task_id: Annotated[str, typer.Argument(help="The task to move (ASSIGNED or RUNNING).")],
    node_id: Annotated[str, typer.Argument(help="Target node; omit to let placement choose.")] = "",
    expected_epoch: Annotated[
        int | None,
        typer.Option(
            "--expected-epoch", min=0, help="Move only if the task is still at this epoch."
        ),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why, for the record.")] = "",
    release_timeout_s: Annotated[
        float,
        typer.Option(
            "--release-timeout-s", min=0.0, help="Seconds the owner gets to release; 0 = default."
        ),
    ] = 0.0,
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Move a running task to another node: released with a final checkpoint, resumed there.

    --json prints the MigrateTaskResponse: {"task": TaskRecord (with "move"),
    "move_id": "..."}.

    Example: lazarus migrate task-3798de419cd70d9f worker-2 --expected-epoch 1
    """
    reply = _run_operator(
        coordinators,
        json_output,
        lambda c: c.migrate(
            task_id,
            node_id,
            expected_epoch=expected_epoch,
            reason=reason,
            release_timeout_s=release_timeout_s,
        ),
        not_found="list them with `lazarus tasks` / `lazarus nodes`",
    )
    if json_output:
        _print_json(_as_json(reply))
        return
    out = _console()
    t = reply.task
    out.print(
        f"moving [bold]{t.task_id}[/] from {t.owner_node_id or '?'} to "
        f"{node_id or 'a node placement chooses'} (move {reply.move_id})"
    )
    out.print(f"  follow: lazarus watch --task {t.task_id}", markup=False)


def event_line(event: Any) -> str:
    """One line for an Event: ``HH:MM:SS.mmm  revision  TYPE  key=value ...`` (rich markup)."""
    import datetime
    import json

    from rich.markup import escape

    body_name = event.WhichOneof("body") or "unknown"
    body = _as_json(getattr(event, body_name)) if event.WhichOneof("body") else {}
    parts = []
    for key, value in body.items():
        text = (
            json.dumps(value, separators=(",", ":"))
            if isinstance(value, dict | list)
            else str(value)
        )
        parts.append(f"{key}={text}")
    moment = datetime.datetime.fromtimestamp(event.occurred_at_unix_ms / 1000, tz=datetime.UTC)
    clock = moment.strftime("%H:%M:%S.%f")[:-3]
    kind = body_name.upper()
    style = (
        "red"
        if kind in ("NODE_DEAD", "TASK_FAILED", "ZOMBIE_FENCED", "CONFLICT_DETECTED")
        else "bold"
    )
    return (
        f"[dim]{clock}[/]  {event.revision:>14}  [{style}]{kind:<18}[/] {escape(' '.join(parts))}"
    )


@app.command()
def watch(
    from_revision: Annotated[
        int, typer.Option("--from-revision", min=0, help="First revision (0 = from now on).")
    ] = 0,
    event_type: Annotated[
        list[str] | None,
        typer.Option(
            "--type",
            help="Only this event type (e.g. task_completed, node_dead); repeat or comma-separate.",
        ),
    ] = None,
    task_id: Annotated[str, typer.Option("--task", help="Only events about this task.")] = "",
    node_id: Annotated[str, typer.Option("--node", help="Only events about this node.")] = "",
    coordinators: CoordinatorsOption = DEFAULT_COORDINATORS,
    json_output: JsonOption = False,
) -> None:
    """Follow cluster events live, one line each, until Ctrl-C.

    The stream resumes on another coordinator when one fails, from the last
    revision seen. --json prints one Event per line (JSON lines:
    {"revision": "...", "occurred_at_unix_ms": "...", "term": "...",
    "<body>": {...}}).

    Example: lazarus watch --type task_completed,task_failed --node worker-0
    """
    from lazarus.client import InvalidArgument, event_type_value

    types = []
    for value in _split(event_type):
        try:
            types.append(event_type_value(value, "--type"))
        except InvalidArgument as exc:
            raise typer.BadParameter(exc.message.partition(": ")[2], param_hint="--type") from exc
    out = _console()
    err = _console(stderr=True)

    async def follow(client: Any) -> None:
        import json

        stream = client.watch(from_revision, types=types, task_id=task_id, node_id=node_id)
        try:
            async for event in stream:
                if json_output:
                    typer.echo(json.dumps(_as_json(event), separators=(",", ":")))
                else:
                    out.print(event_line(event))
        finally:
            await stream.aclose()

    if not json_output:
        err.print(f"watching events at {coordinators} (Ctrl-C ends)", markup=False)
    try:
        _run_operator(coordinators, json_output, follow)
    except KeyboardInterrupt:
        if not json_output:
            err.print("stopped", markup=False)
