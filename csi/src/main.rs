//! `lunkit-csi`: the CSI node plugin's binary. See the crate's README for deploying it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use lunkit::Root;
use lunkit_csi::{Config, IdentityService, NodeService, identity, log, metrics, server, topology};

/// A CSI node plugin for statically provisioned iSCSI, Fibre Channel and NVMe/TCP volumes,
/// with their multipath maps, built on lunkit: it stages, publishes, grows and takes them
/// off the node, never while anything uses them.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Where to serve CSI: unix:///path/to/csi.sock.
    #[arg(long)]
    endpoint: String,
    /// This node's id, as NodeGetInfo reports it (normally the Kubernetes node name).
    #[arg(long)]
    nodeid: String,
    /// The directory that stands for the node's / (its sys/, dev/, proc/ and run/ are used):
    /// /host in a container that mounts the host there.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// kubelet's directory (its --root-dir), as mounted in the plugin's container with
    /// bidirectional propagation: /var/lib/k0s/kubelet on k0s,
    /// /var/snap/microk8s/common/var/lib/kubelet on microk8s. Checked at start.
    #[arg(long, value_name = "DIR", default_value = lunkit_csi::paths::KUBELET_DIR,
          value_parser = lunkit_csi::paths::kubelet_dir)]
    kubelet_dir: PathBuf,
    /// Where stage records are kept (made mode 0700); must survive a restart of the plugin.
    #[arg(long, default_value = "/var/lib/lunkit-csi")]
    state_dir: PathBuf,
    /// The plugin name GetPluginInfo reports (the CSIDriver object's name).
    #[arg(long, default_value = identity::DEFAULT_NAME)]
    driver_name: String,
    /// NodeGetInfo's max_volumes_per_node; 0 for no limit.
    #[arg(long, default_value_t = 0)]
    max_volumes: i64,
    /// Deadline of one NodeStageVolume or NodeUnstageVolume, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Where this node is, for NodeGetInfo's accessible_topology: KEY=VALUE, repeatable
    /// (topology.kubernetes.io/zone=eu-1a). Keys and values as CSI's Topology wants them.
    #[arg(long, value_name = "KEY=VALUE", value_parser = topology::parse_segment)]
    topology: Vec<(String, String)>,
    /// open-iscsi's node database, where CHAP secrets are written into the node records
    /// (never on iscsiadm's command line) [default: <root>/etc/iscsi/nodes, the host's under
    /// `--root /host`, which the host's iscsiadm and iscsid read].
    #[arg(long)]
    iscsi_nodes: Option<PathBuf>,
    /// Transports Probe checks even before any of their volumes is staged: iscsi (iscsid
    /// answers), nvme (<root>/dev/nvme-fabrics exists); comma-separated. A transport with a
    /// volume staged is checked whatever this says.
    #[arg(long, value_name = "iscsi,nvme", value_delimiter = ',')]
    transports: Vec<lunkit_csi::probe::Transport>,
    /// Serve Prometheus metrics on ADDR:PORT (plain HTTP, GET /metrics); none when not given.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_address: Option<String>,
    /// Look for leftovers on the node (lunkit doctor, read only) every this many seconds:
    /// counts by kind on the metrics, each new finding logged once; 0 never looks.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    doctor_interval: u64,
    /// How long a state the kernel may still recover from (a SCSI device blocked, an NVMe
    /// controller not live) must have lasted before the doctor counts it, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    doctor_grace: u64,
    /// Follow the discovery services that staged NVMe volumes name (`discoveryAddrs`): a
    /// persistent discovery controller per service, and the ports the array adds or removes
    /// later connected or deleted with no call; false leaves the paths as stage found them.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    follow_discovery: bool,
    /// How the log on standard error is written: text, or one JSON object a line.
    #[arg(long, value_enum, default_value_t = log::Format::Text)]
    log_format: log::Format,
}

async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    log::init(args.log_format);
    // What no single value shows (a key given twice, prefixes that differ) is a usage error
    // too: clap's message and exit code 2, before anything starts.
    let segments = match topology::segments(&args.topology) {
        Ok(s) => s,
        Err(e) => Args::command()
            .error(clap::error::ErrorKind::ValueValidation, e)
            .exit(),
    };
    match run(args, segments) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::note(log::Level::Error, &e.to_string());
            ExitCode::FAILURE
        }
    }
}

/// The plugin's threads beside the server: the fencing of joining paths, and the doctor
/// every `doctor_interval` seconds (0: never).
fn background(
    node: &NodeService,
    doctor_interval: u64,
    doctor_grace: Duration,
) -> lunkit_csi::Result<()> {
    // Paths that join a fenced volume get this node's key as they come.
    lunkit_csi::fence_join::spawn(node.clone()).map_err(|e| {
        lunkit_csi::Error::Internal(format!("cannot start the fencing thread: {e}"))
    })?;
    if doctor_interval > 0 {
        let every = Duration::from_secs(doctor_interval);
        lunkit_csi::doctor::spawn(node.clone(), every, doctor_grace).map_err(|e| {
            lunkit_csi::Error::Internal(format!("cannot start the doctor thread: {e}"))
        })?;
    }
    Ok(())
}

fn run(args: Args, segments: std::collections::BTreeMap<String, String>) -> lunkit_csi::Result<()> {
    use lunkit_csi::Error;
    if !identity::valid_name(&args.driver_name) {
        return Err(Error::InvalidArgument(format!(
            "--driver-name {:?} is not a CSI plugin name (at most 63 letters, digits, '-' and '.')",
            args.driver_name
        )));
    }
    if args.nodeid.is_empty() {
        return Err(Error::InvalidArgument("--nodeid is empty".into()));
    }
    if args.timeout == 0 || args.timeout > 86_400 {
        return Err(Error::InvalidArgument(
            "--timeout must be 1 to 86400 seconds".into(),
        ));
    }
    let path = server::socket_path(&args.endpoint)?;
    let mut config = Config::new(args.nodeid);
    config.root = Root::new(&args.root);
    lunkit_csi::paths::check_root(&config.root)?;
    // A warning, not a refusal: the plugin serves calls whatever their paths, and a
    // misconfigured directory shows in the pods (empty volumes); the log says why.
    if let Some(problem) = lunkit_csi::paths::check_kubelet_dir(&args.kubelet_dir) {
        log::note(log::Level::Warn, &problem);
    }
    config.state_dir = args.state_dir;
    config.max_volumes = args.max_volumes;
    config.iscsi_nodes = args
        .iscsi_nodes
        .unwrap_or_else(|| config.root.path().join("etc/iscsi/nodes"));
    config.stage_timeout = Duration::from_secs(args.timeout);
    config.unstage_timeout = Duration::from_secs(args.timeout);
    let constrained = !segments.is_empty();
    config.topology = segments;
    config.transports = args.transports.into_iter().collect();
    config.follow_discovery = args.follow_discovery;
    let doctor_interval = args.doctor_interval;
    let doctor_grace = Duration::from_secs(args.doctor_grace);
    // Bound before the node service starts the discovery followers: see `bind_socket`.
    let socket = bind_socket(&path)?;
    // A plugin that does not start leaves no socket for the sidecars to find.
    let node = NodeService::new(config).inspect_err(|_| {
        let _ = std::fs::remove_file(&path);
    })?;
    background(&node, doctor_interval, doctor_grace)?;
    let identity = IdentityService::new(args.driver_name)
        .accessibility_constraints(constrained)
        .checks(node.checks());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the runtime: {e}")))?;
    let store = node.store().clone();
    let metrics_address = args.metrics_address;
    let served = rt.block_on(async move {
        if let Some(address) = metrics_address {
            let listener = metrics::bind(&address).await?;
            let bound = listener.local_addr().map_or(address, |a| a.to_string());
            log::note(log::Level::Info, &format!("metrics on http://{bound}/metrics"));
            tokio::spawn(metrics::serve(listener, metrics::global(), store));
        }
        let listener = tokio::net::UnixListener::from_std(socket).map_err(|e| {
            Error::Internal(format!("cannot serve on {}: {e}", path.display()))
        })?;
        log::note(log::Level::Info, &format!("serving on {}", path.display()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut serving = tokio::spawn(server::serve(listener, identity, node, async {
            let _ = stopped.await;
        }));
        tokio::select! {
            r = &mut serving => return r.map_err(|e| Error::Internal(format!("the server task failed: {e}")))?,
            () = shutdown() => {}
        }
        // A graceful shutdown waits for every connection to close, and kubelet keeps its
        // connection open: give calls in progress a grace period, then go. A call cut short
        // is one the CO repeats, and the stage records make every call safe to repeat.
        let _ = stop.send(());
        match tokio::time::timeout(SHUTDOWN_GRACE, serving).await {
            Ok(r) => r.map_err(|e| Error::Internal(format!("the server task failed: {e}")))?,
            Err(_) => {
                log::note(
                    log::Level::Warn,
                    &format!(
                        "connections still open {}s after the signal; exiting",
                        SHUTDOWN_GRACE.as_secs()
                    ),
                );
                Ok(())
            }
        }
    });
    // Calls still running on the blocking pool are abandoned, not waited for.
    rt.shutdown_timeout(Duration::from_millis(100));
    served
}

/// The CSI socket at `path`, bound before any thread starts: [`server::bind`] narrows the
/// umask while it makes the socket (mode 0600 from the start), and the umask is the whole
/// process's, so a discovery follower or the doctor making a file or a directory in that
/// moment would get the socket's mode. A runtime on this thread alone (it starts no thread)
/// lends its reactor for the bind; the listener moves to the serving runtime later.
fn bind_socket(path: &std::path::Path) -> lunkit_csi::Result<std::os::unix::net::UnixListener> {
    use lunkit_csi::Error;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start a runtime to bind the socket: {e}")))?;
    let _in_runtime = rt.enter();
    let listener = server::bind(path)?;
    listener
        .into_std()
        .map_err(|e| Error::Internal(format!("bind {}: {e}", path.display())))
}

/// How long a SIGTERM waits for calls in progress.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
