"""``lazarus coordinator`` and ``lazarus node-agent``: the two server processes.

Options map to the settings dataclasses (``coordinator.server.ServerSettings``,
``coordinator.core.CoreSettings``, ``node_agent.settings.AgentSettings``); every
one also reads a ``LAZARUS_*`` environment variable (the Helm chart sets them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from coordinator.core.settings import CoreSettings
from lazarus.cli._app import app

DetectorChoice = Literal["fixed", "phi"]
_CORE = CoreSettings()
"""Defaults of the coordinator's core options (DESIGN.md §10)."""
ARCHIVE_TTL_S = 7 * 24 * 3600
"""``coordinator.recordarchive.DEFAULT_TTL_S`` (a literal here: the CLI does not import redis)."""
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


@app.command(rich_help_panel="Servers")
def coordinator(
    ctx: typer.Context,
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
    archive_ttl_s: Annotated[
        int,
        typer.Option(
            envvar="LAZARUS_ARCHIVE_TTL_S",
            min=0,
            help="Seconds Redis keeps a record retention moved out of etcd, and the finished "
            "task's checkpoints, from its retirement (0: forever; Redis then grows with every "
            "task the fleet runs).",
        ),
    ] = ARCHIVE_TTL_S,
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
            help="Seconds a finished task, or a DEAD or LEFT node owning no task, stays in etcd "
            "before the Redis archive.",
        ),
    ] = _CORE.retention_s,
    progress_flush_interval_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_PROGRESS_FLUSH_INTERVAL_S",
            min=0.0,
            help=(
                "Write running tasks' checkpoint progress to etcd together at most this "
                "often, seconds (a new leader may see it this much older); 0: every report."
            ),
        ),
    ] = _CORE.progress_flush_interval_s,
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
    fan_in: Annotated[
        bool,
        typer.Option(
            "--fan-in/--no-fan-in",
            envvar="LAZARUS_FAN_IN",
            help="As a follower, hold node agents' Sessions and forward them to the leader "
            "over one stream (docs/fan-in.md) instead of answering NotLeader. Every replica "
            "must run the same version; off by default while fan-in is being built.",
        ),
    ] = False,
    interregnum_acks: Annotated[
        bool,
        typer.Option(
            "--interregnum-acks/--no-interregnum-acks",
            envvar="LAZARUS_INTERREGNUM_ACKS",
            help="With --fan-in: once the leader's election key is seen deleted, a follower "
            "acks its agents' heartbeats for a bounded window (rule (b) of docs/fan-in.md), "
            "so a leader crash fences no agent. Off: only the leader's acks count.",
        ),
    ] = True,
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

    With --fan-in, followers hold agents' Sessions and forward them to the
    leader, and --fence-after-s / --dead-after-s default to 5 / 6 s (the
    fan-in profile of docs/fan-in.md): a leader crash then pauses no task,
    since a new leader is elected (lease TTL 3 s) before agents would fence;
    a dead node's tasks move after 6 s instead of 3 s.

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
    if fan_in:
        from coordinator.core.fanin import FanInSettings

        profile = FanInSettings()
        if ctx.get_parameter_source("fence_after_s").name == "DEFAULT":  # type: ignore[union-attr]
            fence_after_s = profile.fence_after_s
        if ctx.get_parameter_source("dead_after_s").name == "DEFAULT":  # type: ignore[union-attr]
            dead_after_s = profile.dead_after_s
        try:
            FanInSettings(
                heartbeat_interval_s=heartbeat_interval_s,
                fence_after_s=fence_after_s,
                dead_after_s=dead_after_s,
                lease_ttl_s=float(lease_ttl_s),
            )
        except UsageError as exc:
            raise typer.BadParameter(f"--fan-in: {exc}") from exc
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
            progress_flush_interval_s=progress_flush_interval_s,
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
            archive_ttl_s=archive_ttl_s,
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
            fan_in=fan_in,
            interregnum_acks=interregnum_acks,
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


@app.command("node-agent", rich_help_panel="Servers")
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
    resolve_coordinators: Annotated[
        bool,
        typer.Option(
            envvar="LAZARUS_RESOLVE_COORDINATORS",
            help="Dial every address each --coordinators name resolves to (name a "
            "headless Service: every replica), skipping for 3 s one that could not be "
            "reached; re-resolved every 5 s. Off: dial the names as given.",
        ),
    ] = False,
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
    worker_nice: Annotated[
        int,
        typer.Option(
            envvar="LAZARUS_WORKER_NICE",
            min=0,
            max=19,
            help="How much lower than the agent's the CPU priority of worker processes is "
            "(nice increment): the agent's heartbeats and checkpoints win a core from "
            "CPU-bound handlers. 0 runs them at the agent's priority.",
        ),
    ] = 10,
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
    replication_linger_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_REPLICATION_LINGER_S",
            min=0.0,
            max=1.0,
            help="How long a record of a task with local durability may wait for others "
            "to share its Redis round trip, seconds: less CPU per checkpoint, a Redis copy "
            "that lags by at most this much more after a node loss. Replicated durability "
            "never waits.",
        ),
    ] = 0.5,
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
    progress_report_interval_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_PROGRESS_REPORT_INTERVAL_S",
            help="Report a replicated task's newest checkpoint to the leader at most this "
            "often, seconds: what `lazarus tasks` shows, and the evidence that detects Redis "
            "losing acknowledged checkpoints. Each report is an etcd write.",
        ),
    ] = 1.0,
    local_progress_report_interval_s: Annotated[
        float,
        typer.Option(
            envvar="LAZARUS_LOCAL_PROGRESS_REPORT_INTERVAL_S",
            help="The same for tasks with local durability (their checkpoints promise "
            "nothing of Redis): fewer etcd writes and less CPU per checkpoint.",
        ),
    ] = 5.0,
    keep_checkpoints: Annotated[
        int,
        typer.Option(
            envvar="LAZARUS_KEEP_CHECKPOINTS",
            min=0,
            help="Checkpoints the local store keeps of each task running here, about: "
            "older ones are pruned (with the journal they cover) once a task holds a "
            "tenth more. The newest, a terminal one and any Redis may lack always stay. "
            "0 keeps them all until the task ends.",
        ),
    ] = 10_000,
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
            resolve_coordinators=resolve_coordinators,
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
            worker_nice=worker_nice,
            max_payload_bytes=max_payload_bytes,
            replication_backlog=replication_backlog,
            replication_linger_s=replication_linger_s,
            metrics_listen=metrics_listen,
            fence_lead_s=fence_lead_s,
            progress_report_interval_s=progress_report_interval_s,
            local_progress_report_interval_s=local_progress_report_interval_s,
            keep_checkpoints=keep_checkpoints,
            tls=ClientTls(tls_ca_file, tls_cert_file, tls_key_file, tls_server_name),
        )
    except (SettingsError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    code = run_node_agent(settings)
    if code:
        raise typer.Exit(code)
