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

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

/// The authority every request is given.
pub const AUTHORITY: &[u8] = b"localhost";

/// HTTP/2's connection preface, which the client sends first.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The largest frame the server takes (HTTP/2's initial SETTINGS_MAX_FRAME_SIZE, which h2
/// keeps unless told otherwise).
const MAX_FRAME: usize = 16_384;

/// The largest header block relayed; a larger one ends the connection.
const MAX_BLOCK: usize = 1 << 20;

/// Relays one connection between `client` and `server` (the end of a duplex pipe the
/// gRPC server reads) until either side closes it.
pub async fn relay<C>(client: C, server: DuplexStream)
where
    C: AsyncRead + AsyncWrite + Send + 'static,
{
    let (client_r, mut client_w) = tokio::io::split(client);
    let (mut server_r, server_w) = tokio::io::split(server);
    let up = tokio::spawn(async move {
        let mut server_w = server_w;
        let r = forward_requests(client_r, &mut server_w).await;
        let _ = server_w.shutdown().await;
        r
    });
    let _ = tokio::io::copy(&mut server_r, &mut client_w).await;
    let _ = client_w.shutdown().await;
    up.abort();
}

/// A header block being put together from a HEADERS frame and its CONTINUATIONs.
struct Block {
    stream: [u8; 4],
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// Copies the client's frames to `to`, every header block's `:authority` rewritten.
async fn forward_requests(
    mut from: impl AsyncRead + Unpin,
    to: &mut (impl AsyncWrite + Unpin),
) -> io::Result<()> {
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: h2 refuses it; nothing to rewrite.
        return tokio::io::copy(&mut from, to).await.map(drop);
    }
    let mut hpack = hpack::Decoder::new();
    let mut open: Option<Block> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        let block = match (kind, open.take()) {
            (HEADERS, None) => start_block(&head, flags, &payload)?,
            (CONTINUATION, Some(mut b)) if head[5..9] == b.stream => {
                b.fragment.extend_from_slice(&payload);
                b
            }
            (HEADERS | CONTINUATION, _) | (_, Some(_)) => {
                return Err(bad("a header block interleaved with other frames"));
            }
            _ => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                to.flush().await?;
                continue;
            }
        };
        if block.fragment.len() > MAX_BLOCK {
            return Err(bad("a header block over 1 MiB"));
        }
        if flags & END_HEADERS == 0 {
            open = Some(block);
            continue;
        }
        // The decoder is an old crate: should it panic on a hostile block, that ends this
        // connection, as a block that does not decode does, and nothing else.
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hpack.decode(&block.fragment)
        }))
        .map_err(|_| bad("a header block the decoder failed on"))?;
        let headers =
            decoded.map_err(|e| bad(&format!("a header block does not decode: {e:?}")))?;
        to.write_all(&frames(&block, &rewrite(headers))).await?;
        to.flush().await?;
    }
}

/// The block a HEADERS frame starts: its padding dropped, its priority kept.
fn start_block(head: &[u8; 9], flags: u8, payload: &[u8]) -> io::Result<Block> {
    let mut p = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&n, rest) = p
            .split_first()
            .ok_or_else(|| bad("a padded frame without padding"))?;
        pad = usize::from(n);
        p = rest;
    }
    let priority = if flags & PRIORITY != 0 {
        let (pr, rest) = p
            .split_first_chunk::<5>()
            .ok_or_else(|| bad("a HEADERS frame too short for its priority"))?;
        p = rest;
        Some(*pr)
    } else {
        None
    };
    let fragment = p
        .get(
            ..p.len()
                .checked_sub(pad)
                .ok_or_else(|| bad("padding longer than the frame"))?,
        )
        .unwrap_or_default()
        .to_vec();
    Ok(Block {
        stream: [head[5], head[6], head[7], head[8]],
        end_stream: flags & END_STREAM != 0,
        priority,
        fragment,
    })
}

/// `headers` with `:authority` set to [`AUTHORITY`] (left out when the client sent none),
/// encoded as literals without indexing.
fn rewrite(headers: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let value = if name == b":authority" {
            AUTHORITY.to_vec()
        } else {
            value
        };
        // Literal header field without indexing, new name (RFC 7541 6.2.2).
        out.push(0);
        literal(&mut out, &name);
        literal(&mut out, &value);
    }
    out
}

/// A string literal without Huffman coding: its length (7-bit prefix integer), then it.
fn literal(out: &mut Vec<u8>, s: &[u8]) {
    out.extend(hpack::encoder::encode_integer(s.len(), 7));
    out.extend_from_slice(s);
}

/// The HEADERS frame (and CONTINUATIONs past [`MAX_FRAME`]) carrying `fragment` for `b`.
fn frames(b: &Block, fragment: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut first_payload = Vec::new();
    if let Some(p) = b.priority {
        first_payload.extend_from_slice(&p);
    }
    let room = MAX_FRAME - first_payload.len();
    let (first, mut rest) = fragment.split_at(fragment.len().min(room));
    first_payload.extend_from_slice(first);
    let mut flags = if b.end_stream { END_STREAM } else { 0 };
    if b.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    frame(&mut out, HEADERS, flags, b.stream, &first_payload);
    while !rest.is_empty() {
        let (chunk, more) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = more;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        frame(&mut out, CONTINUATION, flags, b.stream, chunk);
    }
    out
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: [u8; 4], payload: &[u8]) {
    let len = payload.len().to_be_bytes();
    out.extend_from_slice(&len[len.len() - 3..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream);
    out.extend_from_slice(payload);
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 from the client: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_frame(flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame(&mut out, HEADERS, flags, stream.to_be_bytes(), payload);
        out
    }

    /// What the relay makes of `input` (the preface is added), and the header blocks in it
    /// decoded.
    async fn relayed(input: &[u8]) -> (Vec<u8>, Vec<Vec<(Vec<u8>, Vec<u8>)>>) {
        let mut all = PREFACE.to_vec();
        all.extend_from_slice(input);
        let mut out = Vec::new();
        forward_requests(&all[..], &mut out).await.unwrap();
        assert_eq!(&out[..24], PREFACE);
        let mut blocks = Vec::new();
        let mut dec = hpack::Decoder::new();
        let mut rest = &out[24..];
        let mut block = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let payload = &rest[9..9 + len];
            if kind == HEADERS || kind == CONTINUATION {
                let skip = if kind == HEADERS && flags & PRIORITY != 0 {
                    5
                } else {
                    0
                };
                block.extend_from_slice(&payload[skip..]);
                if flags & END_HEADERS != 0 {
                    blocks.push(dec.decode(&block).unwrap());
                    block.clear();
                }
            }
            rest = &rest[9 + len..];
        }
        (out, blocks)
    }

    fn request(authority: &[u8]) -> Vec<(&'static [u8], Vec<u8>)> {
        vec![
            (b":method", b"POST".to_vec()),
            (b":scheme", b"http".to_vec()),
            (b":path", b"/csi.v1.Identity/Probe".to_vec()),
            (b":authority", authority.to_vec()),
            (b"content-type", b"application/grpc".to_vec()),
        ]
    }

    #[tokio::test]
    async fn a_percent_encoded_authority_becomes_localhost_and_the_rest_stays() {
        // Encoded as a client would, with its dynamic table (the second request indexes the
        // first's entries), Huffman-free; split over a CONTINUATION, padded.
        let mut enc = hpack::Encoder::new();
        let req = request(b"csi%2Fcsi.sock");
        let one = enc.encode(req.iter().map(|(n, v)| (*n, v.as_slice())));
        let two = enc.encode(req.iter().map(|(n, v)| (*n, v.as_slice())));
        let mut input = Vec::new();
        let mut padded = vec![3u8];
        padded.extend_from_slice(&one[..4]);
        padded.extend_from_slice(&[0, 0, 0]);
        input.extend(headers_frame(PADDED, 1, &padded));
        frame(
            &mut input,
            CONTINUATION,
            END_HEADERS,
            1u32.to_be_bytes(),
            &one[4..],
        );
        // A DATA frame passes as it is.
        frame(
            &mut input,
            0x0,
            END_STREAM,
            1u32.to_be_bytes(),
            b"\0\0\0\0\0",
        );
        input.extend(headers_frame(END_HEADERS | END_STREAM, 3, &two));
        let (out, blocks) = relayed(&input).await;
        assert_eq!(blocks.len(), 2);
        for b in &blocks {
            let want: Vec<(Vec<u8>, Vec<u8>)> = request(b"localhost")
                .into_iter()
                .map(|(n, v)| (n.to_vec(), v))
                .collect();
            assert_eq!(b, &want);
        }
        let data = [0u8, 0, 5, 0x0, END_STREAM, 0, 0, 0, 1, 0, 0, 0, 0, 0];
        assert!(
            out.windows(data.len()).any(|w| w == data),
            "the DATA frame passed"
        );
    }

    #[tokio::test]
    async fn a_request_without_authority_gets_none_and_frames_split_at_the_limit() {
        let mut enc = hpack::Encoder::new();
        let big = vec![b'x'; 40_000];
        let headers: Vec<(&[u8], &[u8])> = vec![(b":method", b"POST"), (b"x-big", &big)];
        let block = enc.encode(headers.iter().copied());
        let (out, blocks) = relayed(&headers_frame(END_HEADERS, 1, &block)).await;
        assert_eq!(
            blocks,
            vec![vec![
                (b":method".to_vec(), b"POST".to_vec()),
                (b"x-big".to_vec(), big.clone())
            ]]
        );
        // No frame over the server's limit.
        let mut rest = &out[24..];
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            assert!(len <= MAX_FRAME, "a frame of {len} bytes");
            rest = &rest[9 + len..];
        }
    }

    #[tokio::test]
    async fn a_block_that_does_not_decode_ends_the_connection() {
        let mut all = PREFACE.to_vec();
        all.extend(headers_frame(
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff],
        ));
        let mut out = Vec::new();
        let e = forward_requests(&all[..], &mut out).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
