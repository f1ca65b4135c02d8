//! Serving any conforming gRPC client on the Unix socket, whatever `:authority` it sends.
//!
//! h2, the HTTP/2 server under tonic, parses every request's `:authority` as a URI authority
//! and answers one that does not parse with `RST_STREAM` (`PROTOCOL_ERROR`). For a Unix
//! socket target gRPC clients send what they like there: grpc-go sends `localhost`, but
//! grpc-core (PyPI's grpcio, and the C++, Ruby and C# clients) sends the percent-encoded path
//! (`csi%2Fcsi.sock` for `unix:///csi/csi.sock`), which h2 refuses (a `%` outside userinfo),
//! and grpc-java sends the path itself. h2 has no setting to relax this, and a host name
//! means nothing on a Unix socket.
//!
//! So every connection is relayed: the client's HTTP/2 frames are read, each header block
//! (HEADERS and its CONTINUATIONs) is decoded with the connection's HPACK state, its
//! `:authority` replaced by `localhost`, and the block encoded again with literals only (no
//! dynamic table, so h2's decoder state stays empty); every other frame, and everything the
//! server sends back, passes unchanged.
//!
//! The relay decodes what h2 would, so it holds itself to h2's limits, or a client could make
//! it hold what h2 never would: a frame is at most [`MAX_FRAME`] (checked before it is read),
//! a header block at most [`MAX_BLOCK`] in at most [`MAX_CONTINUATIONS`] CONTINUATIONs, its
//! decoded list at most [`MAX_LIST`] and the HPACK table at most [`MAX_TABLE`] (the `hpack`
//! crate decodes, but a walk of our own checks each block first: `headers.rs` says why). A
//! client over a limit gets a GOAWAY with the error code HTTP/2 names for it, and its
//! connection, only its, is closed. A connection's relay then holds at most a frame, a block,
//! its list encoded twice and the table (some 100 KiB) beside the pipes' buffers, whatever
//! the client sends.

mod headers;
mod upstream;

pub use headers::{MAX_LIST, MAX_TABLE};

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::oneshot;

use crate::log::{self, Level};

/// The authority every request is given.
pub const AUTHORITY: &[u8] = b"localhost";

/// The largest frame the server takes (HTTP/2's initial SETTINGS_MAX_FRAME_SIZE, which hyper
/// advertises unless told otherwise); a longer one is a FRAME_SIZE_ERROR (RFC 9113 §4.2).
pub const MAX_FRAME: usize = 16_384;

/// The largest header block (its fragments put together, padding left out): twice the
/// largest header list. A list's plainest encoding (literals, no Huffman) is already shorter
/// than the list counts (32 octets an entry), and encoders take Huffman only when shorter.
pub const MAX_BLOCK: usize = 2 * MAX_LIST;

/// The most CONTINUATION frames in a header block: clients fill each frame, and a block of
/// [`MAX_BLOCK`] takes 2 or 3; an empty CONTINUATION costs no memory but a wake-up, and a
/// flood of them (2024's CONTINUATION floods, which h2 bounds alike) is refused.
pub const MAX_CONTINUATIONS: usize = 8;

/// HTTP/2 error codes (RFC 9113 §7) a GOAWAY of the relay carries.
pub const PROTOCOL_ERROR: u32 = 0x1;
/// A frame over [`MAX_FRAME`].
pub const FRAME_SIZE_ERROR: u32 = 0x6;
/// A header block that does not decode, or asks for a table over 4 KiB.
pub const COMPRESSION_ERROR: u32 = 0x9;
/// A header list, block or CONTINUATION count over its limit: the code h2 gives these.
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

const GOAWAY: u8 = 0x7;

/// Why the relay ends a connection: the GOAWAY it sends the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The HTTP/2 error code.
    pub code: u32,
    /// What the client did, sent as the GOAWAY's debug data and logged.
    pub what: String,
    /// The highest stream a request was passed on for.
    pub last_stream: u32,
}

impl Refusal {
    fn new(code: u32, what: String) -> Refusal {
        Refusal {
            code,
            what,
            last_stream: 0,
        }
    }

    /// The GOAWAY frame (RFC 9113 §6.8) saying so.
    fn frame(&self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(8 + self.what.len());
        payload.extend_from_slice(&(self.last_stream & 0x7fff_ffff).to_be_bytes());
        payload.extend_from_slice(&self.code.to_be_bytes());
        payload.extend_from_slice(self.what.as_bytes());
        let mut out = Vec::new();
        upstream::frame(&mut out, GOAWAY, 0, [0; 4], &payload);
        out
    }
}

/// How a connection's requests stopped being relayed, other than by the client closing it.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Reading the client or writing the server failed: nothing to tell either.
    Broken,
    /// The client broke a limit or the protocol: it gets a GOAWAY.
    Refused(Refusal),
}

impl Ended {
    fn at(self, last_stream: u32) -> Ended {
        match self {
            Ended::Refused(r) => Ended::Refused(Refusal { last_stream, ..r }),
            broken => broken,
        }
    }
}

impl From<io::Error> for Ended {
    fn from(_: io::Error) -> Ended {
        Ended::Broken
    }
}

impl From<Refusal> for Ended {
    fn from(r: Refusal) -> Ended {
        Ended::Refused(r)
    }
}

/// Relays one connection between `client` and `server` (the end of a duplex pipe the
/// gRPC server reads) until either side closes it, or the client breaks a limit: then the
/// client is sent a GOAWAY and both are closed.
pub async fn relay<C>(client: C, server: DuplexStream)
where
    C: AsyncRead + AsyncWrite + Send + 'static,
{
    let (client_r, mut client_w) = tokio::io::split(client);
    let (server_r, server_w) = tokio::io::split(server);
    let (refuse, refused) = oneshot::channel();
    let up = tokio::spawn(async move {
        let mut server_w = server_w;
        if let Err(Ended::Refused(r)) = upstream::forward_requests(client_r, &mut server_w).await {
            let _ = refuse.send(r);
        }
        let _ = server_w.shutdown().await;
    });
    let _ = forward_responses(server_r, &mut client_w, refused).await;
    let _ = client_w.shutdown().await;
    up.abort();
}

/// Copies the server's frames to the client until the server closes, or until `refused`
/// gives a refusal: then, between two frames, the client is sent its GOAWAY, and the copy
/// ends.
async fn forward_responses(
    mut from: impl AsyncRead + Unpin,
    to: &mut (impl AsyncWrite + Unpin),
    mut refused: oneshot::Receiver<Refusal>,
) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_FRAME];
    let mut waiting = true;
    let mut server_went_away = false;
    loop {
        let mut head = [0u8; 9];
        tokio::select! {
            biased;
            r = &mut refused, if waiting => {
                let Ok(r) = r else {
                    // The client closed, or the relay of its side failed: the server's
                    // answers still go.
                    waiting = false;
                    continue;
                };
                log::note(
                    Level::Warn,
                    &format!(
                        "a client of the CSI socket sent {}: its connection is closed ({})",
                        r.what,
                        code_name(r.code)
                    ),
                );
                // A second GOAWAY may not name a later stream than the server's did: when
                // the server sent one, the connection just closes.
                if !server_went_away {
                    to.write_all(&r.frame()).await?;
                    to.flush().await?;
                }
                return Ok(());
            }
            read = from.read_exact(&mut head) => match read {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            },
        }
        server_went_away |= head[3] == GOAWAY;
        to.write_all(&head).await?;
        let mut left =
            usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        while left > 0 {
            let n = from.read(&mut buf[..left.min(MAX_FRAME)]).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            to.write_all(&buf[..n]).await?;
            left -= n;
        }
        to.flush().await?;
    }
}

/// RFC 9113's name of an error code the relay sends.
fn code_name(code: u32) -> &'static str {
    match code {
        PROTOCOL_ERROR => "PROTOCOL_ERROR",
        FRAME_SIZE_ERROR => "FRAME_SIZE_ERROR",
        COMPRESSION_ERROR => "COMPRESSION_ERROR",
        ENHANCE_YOUR_CALM => "ENHANCE_YOUR_CALM",
        _ => "an HTTP/2 error",
    }
}

#[cfg(test)]
mod tests;
