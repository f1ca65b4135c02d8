//! The client's side of a relayed connection: its frames read within the server's limits, each
//! header block decoded ([`super::headers`]) and sent on with `:authority` rewritten.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::headers::{self, Decoder};
use super::{
    AUTHORITY, ENHANCE_YOUR_CALM, Ended, FRAME_SIZE_ERROR, MAX_BLOCK, MAX_CONTINUATIONS, MAX_FRAME,
    PROTOCOL_ERROR, Refusal,
};

/// HTTP/2's connection preface, which the client sends first.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const HEADERS: u8 = 0x1;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

/// A header block being put together from a HEADERS frame and its CONTINUATIONs.
struct Block {
    stream: [u8; 4],
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    continuations: usize,
}

/// What the relay knows of the client's side of one connection.
#[derive(Default)]
struct Upstream {
    decoder: Decoder,
    open: Option<Block>,
    /// The highest stream a header block was sent to the server on: a GOAWAY's last stream.
    last_stream: u32,
    /// The frame being read, never longer than [`MAX_FRAME`].
    payload: Vec<u8>,
}

/// Copies the client's frames to `to`, every header block's `:authority` rewritten, until
/// the client closes (`Ok`), a read or write fails, or the client breaks a limit
/// ([`Ended::Refused`], with the last stream a block was sent on).
pub async fn forward_requests(
    mut from: impl AsyncRead + Unpin,
    to: &mut (impl AsyncWrite + Unpin),
) -> Result<(), Ended> {
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: h2 refuses it; nothing to rewrite.
        tokio::io::copy(&mut from, to).await?;
        return Ok(());
    }
    let mut up = Upstream::default();
    loop {
        match up.next(&mut from, to).await {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => return Err(e.at(up.last_stream)),
        }
    }
}

impl Upstream {
    /// Reads the next frame and passes it on (or adds it to the open block): `false` when the
    /// client closed between frames.
    async fn next(
        &mut self,
        from: &mut (impl AsyncRead + Unpin),
        to: &mut (impl AsyncWrite + Unpin),
    ) -> Result<bool, Ended> {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        // Checked before a byte of it is read or a buffer made for it (RFC 9113 §4.2).
        if len > MAX_FRAME {
            return Err(refused(
                FRAME_SIZE_ERROR,
                format!("a frame of {len} bytes, over the {MAX_FRAME} the server takes"),
            ));
        }
        self.payload.clear();
        self.payload.resize(len, 0);
        from.read_exact(&mut self.payload).await?;
        self.frame(&head, to).await?;
        Ok(true)
    }

    /// Passes on the frame of `head` whose payload was read, or adds it to the open block.
    async fn frame(
        &mut self,
        head: &[u8; 9],
        to: &mut (impl AsyncWrite + Unpin),
    ) -> Result<(), Ended> {
        let (kind, flags) = (head[3], head[4]);
        let block = match (kind, self.open.take()) {
            (HEADERS, None) => start_block(head, flags, &self.payload)?,
            (CONTINUATION, Some(b)) if head[5..9] == b.stream => self.continued(b)?,
            (HEADERS | CONTINUATION, _) | (_, Some(_)) => {
                return Err(refused(
                    PROTOCOL_ERROR,
                    "a header block interleaved with other frames".into(),
                ));
            }
            _ => {
                to.write_all(head).await?;
                to.write_all(&self.payload).await?;
                to.flush().await?;
                return Ok(());
            }
        };
        if flags & END_HEADERS == 0 {
            self.open = Some(block);
            return Ok(());
        }
        let headers = self.decoder.decode(&block.fragment)?;
        let stream = u32::from_be_bytes(block.stream) & 0x7fff_ffff;
        self.last_stream = self.last_stream.max(stream);
        to.write_all(&frames(&block, &headers::rewrite(headers, AUTHORITY)))
            .await?;
        to.flush().await?;
        Ok(())
    }

    /// `b` with the CONTINUATION just read added, within [`MAX_CONTINUATIONS`] and
    /// [`MAX_BLOCK`] (a flood of CONTINUATIONs, empty or not, ends at either).
    fn continued(&self, mut b: Block) -> Result<Block, Ended> {
        b.continuations += 1;
        if b.continuations > MAX_CONTINUATIONS {
            return Err(refused(
                ENHANCE_YOUR_CALM,
                format!("a header block in over {MAX_CONTINUATIONS} CONTINUATION frames"),
            ));
        }
        if b.fragment.len() + self.payload.len() > MAX_BLOCK {
            return Err(refused(
                ENHANCE_YOUR_CALM,
                format!("a header block over {MAX_BLOCK} bytes"),
            ));
        }
        b.fragment.extend_from_slice(&self.payload);
        Ok(b)
    }
}

fn refused(code: u32, what: String) -> Ended {
    Ended::Refused(Refusal::new(code, what))
}

/// The block a HEADERS frame starts: its padding dropped, its priority kept.
fn start_block(head: &[u8; 9], flags: u8, payload: &[u8]) -> Result<Block, Ended> {
    let bad = |what: &str| refused(PROTOCOL_ERROR, what.into());
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
    let end = p
        .len()
        .checked_sub(pad)
        .ok_or_else(|| bad("padding longer than the frame"))?;
    Ok(Block {
        stream: [head[5], head[6], head[7], head[8]],
        end_stream: flags & END_STREAM != 0,
        priority,
        fragment: p[..end].to_vec(),
        continuations: 0,
    })
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

/// Appends a frame of `kind` with `flags` on `stream` carrying `payload`.
pub fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: [u8; 4], payload: &[u8]) {
    let len = payload.len().to_be_bytes();
    out.extend_from_slice(&len[len.len() - 3..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_longer_than_a_frame_is_split_at_the_limit() {
        let block = Block {
            stream: [0, 0, 0, 1],
            end_stream: true,
            priority: Some([0, 0, 0, 0, 16]),
            fragment: Vec::new(),
            continuations: 0,
        };
        let mut rest = &frames(&block, &[b'x'; 40_000])[..];
        let mut seen = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            assert!(len <= MAX_FRAME, "a frame of {len} bytes");
            seen.push((rest[3], rest[4]));
            rest = &rest[9 + len..];
        }
        assert_eq!(
            seen,
            [
                (HEADERS, END_STREAM | PRIORITY),
                (CONTINUATION, 0),
                (CONTINUATION, END_HEADERS)
            ]
        );
    }
}
