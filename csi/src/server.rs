//! Serving the Identity and Node services on a Unix socket, and a client for the same socket
//! (the tests', and any tool's).

use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server, Uri};

use crate::authority;
use crate::error::{Error, Result};
use crate::identity::IdentityService;
use crate::node::NodeService;
use crate::proto::identity_client::IdentityClient;
use crate::proto::identity_server::IdentityServer;
use crate::proto::node_client::NodeClient;
use crate::proto::node_server::NodeServer;

/// The socket path of a `unix:///path` (or `unix:/path`, or a plain absolute path) endpoint.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(Error::InvalidArgument(format!(
            "endpoint {endpoint:?} is not unix:///absolute/path"
        )));
    }
    Ok(PathBuf::from(path))
}

/// Binds `path`, replacing a stale socket left by an earlier run (and only a socket).
pub fn bind(path: &Path) -> Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if !md.file_type().is_socket() {
            return Err(Error::InvalidArgument(format!(
                "{} exists and is not a socket",
                path.display()
            )));
        }
        std::fs::remove_file(path).map_err(|e| {
            Error::Internal(format!("remove the old socket {}: {e}", path.display()))
        })?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Internal(format!("create {}: {e}", dir.display())))?;
    }
    // The socket is made with mode 0600 (the umask, process-wide, is changed only while it is
    // bound: nothing else runs yet), then opened to the group (0660): kubelet runs as root,
    // and a group the operator picks may be let in; other users never.
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let listener = bound.map_err(|e| Error::Internal(format!("bind {}: {e}", path.display())))?;
    set_mode(path, SOCKET_MODE)?;
    Ok(listener)
}

/// The socket's mode: owner and group may connect, nobody else.
pub const SOCKET_MODE: u32 = 0o660;

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |e: std::io::Error| {
        Error::Internal(format!("make {} mode {mode:04o}: {e}", path.display()))
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(fail)?;
    let now = std::fs::metadata(path).map_err(fail)?.permissions().mode() & 0o7777;
    if now != mode {
        return Err(Error::Internal(format!(
            "{} is mode {now:04o} after chmod {mode:04o}",
            path.display()
        )));
    }
    Ok(())
}

/// The buffer of each direction of a connection's relay.
const RELAY_BUFFER: usize = 64 << 10;

/// Serves both services on `listener` until `shutdown` completes.
pub async fn serve(
    listener: UnixListener,
    identity: IdentityService,
    node: NodeService,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    // Each connection is relayed through `authority`, so that clients other than grpc-go
    // (whose `:authority` for a Unix socket h2 refuses) are served too.
    let incoming = UnixListenerStream::new(listener).map(|conn| {
        conn.map(|stream| {
            let (ours, theirs) = tokio::io::duplex(RELAY_BUFFER);
            tokio::spawn(authority::relay(stream, theirs));
            ours
        })
    });
    // Every call is timed and counted by method and code (`--metrics-address`).
    Server::builder()
        .layer(crate::metrics::RpcLayer)
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| Error::Internal(format!("the gRPC server failed: {e}")))
}

/// A channel to the plugin listening on the Unix socket `path`.
pub async fn connect(path: &Path) -> Result<Channel> {
    let path = path.to_path_buf();
    // The URI is required by tonic but unused: every connection goes to the socket.
    Endpoint::try_from("http://[::1]:50051")
        .map_err(|e| Error::Internal(e.to_string()))?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let s = UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .map_err(|e| Error::Internal(format!("connect to the plugin: {e}")))
}

/// Identity and Node clients over one channel.
pub async fn clients(path: &Path) -> Result<(IdentityClient<Channel>, NodeClient<Channel>)> {
    let ch = connect(path).await?;
    Ok((IdentityClient::new(ch.clone()), NodeClient::new(ch)))
}
