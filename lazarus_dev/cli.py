"""Development commands of ``lazarus``: ``demo``, ``drill`` and ``dev`` (a local cluster).

Registered on the ``lazarus`` application when this package is installed
(``lazarus.cli``); every heavy import happens inside a command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lazarus.cli._app import DurabilityChoice, app

demo_app = typer.Typer(
    help="Demonstrations that run on this machine, with real processes and signals.",
    no_args_is_help=True,
)
app.add_typer(demo_app, name="demo", rich_help_panel="Development")


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
    from lazarus_dev.demo import run_checkpoint_demo

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
    from lazarus_dev.fleetdemo import run_fleet_demo

    code = run_fleet_demo(run_dir, tasks, lines, every, work_ms, kill_after_s)
    if code:
        raise typer.Exit(code)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@app.command(rich_help_panel="Development")
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
    settle_timeout: Annotated[
        float,
        typer.Option(
            min=10.0,
            help="Seconds each drill waits after its faults for every task to finish; a task "
            "unfinished then counts as lost, its state and last error in the notes.",
        ),
    ] = 240.0,
    netns: Annotated[
        bool,
        typer.Option(
            help="As root, put the last agent in a network namespace (real partitions); "
            "--no-netns pauses a process instead."
        ),
    ] = True,
    fan_in: Annotated[
        bool,
        typer.Option(
            "--fan-in",
            help="Local cluster only: coordinators run --fan-in and agent i dials replica "
            "i mod 3 first, so followers hold and forward Sessions (docs/fan-in.md).",
        ),
    ] = False,
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

    Ctrl-C or SIGTERM stops the drill's cluster and removes its network
    namespace, then exits with status 130 and no report.

    Example: lazarus drill kill-node --tasks 24 --run-dir ./drill-run
    """
    import asyncio
    import json
    import signal
    import sys
    import tempfile

    from rich.console import Console

    from lazarus_dev.drill import (
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
        from lazarus_dev.drill_remote import KubectlInjector, RemoteCluster, run_remote_drills
        from node_agent.settings import parse_addresses

        remote = RemoteCluster(parse_addresses(coordinators))
        injector = KubectlInjector(kubectl_namespace, kubectl_context)
        console.print(f"[bold]Lazarus drill[/] {scenario} against {coordinators}")
        remote_results = []
        for _ in range(repeat):
            remote_results += asyncio.run(
                run_remote_drills(
                    remote,
                    injector,
                    scenarios,
                    console=console,
                    tasks=tasks,
                    settle_timeout_s=settle_timeout,
                )
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
    # SIGTERM (`timeout`, a CI job's bound, kill) ends the drill as Ctrl-C does: through
    # the finally below, which stops the cluster's processes (each in a session of its
    # own, so they outlive a drill killed outright) and deletes the network namespace.
    signal.signal(signal.SIGTERM, _interrupt)
    with console.status("starting 3 etcd members, Redis, 3 coordinators and the node agents"):
        cluster, ns, why = make_drill_cluster(
            root / "cluster", agents=agents, use_netns=netns, fan_in=fan_in
        )
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
                    settle_timeout_s=settle_timeout,
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


@app.command(rich_help_panel="Development")
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

    from lazarus.v1 import records_pb2
    from lazarus_dev.devcluster import LocalCluster
    from lazarus_dev.localservers import ServerBinaryNotFoundError

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
