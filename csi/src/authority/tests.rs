use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::upstream::{
    CONTINUATION, END_HEADERS, END_STREAM, HEADERS, PADDED, PREFACE, PRIORITY, forward_requests,
    frame,
};
use super::*;

fn headers_frame(flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame(&mut out, HEADERS, flags, stream.to_be_bytes(), payload);
    out
}

fn continuation(flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame(&mut out, CONTINUATION, flags, stream.to_be_bytes(), payload);
    out
}

/// What the relay makes of `input` (the preface is added): what it sent the server, and how
/// it ended.
async fn forwarded(input: &[u8]) -> (Vec<u8>, Result<(), Ended>) {
    let mut all = PREFACE.to_vec();
    all.extend_from_slice(input);
    let mut out = Vec::new();
    let r = forward_requests(&all[..], &mut out).await;
    assert_eq!(&out[..24], PREFACE);
    (out, r)
}

/// The refusal `input` ends with.
async fn refusal(input: &[u8]) -> Refusal {
    match forwarded(input).await.1 {
        Err(Ended::Refused(r)) => r,
        other => panic!("not refused: {other:?}"),
    }
}

/// The frames of `bytes`: kind, flags, payload.
fn parse(mut rest: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        frames.push((rest[3], rest[4], rest[9..9 + len].to_vec()));
        rest = &rest[9 + len..];
    }
    frames
}

/// What the relay makes of `input` (the preface is added), and the header blocks in it
/// decoded.
async fn relayed(input: &[u8]) -> (Vec<u8>, Vec<headers::Headers>) {
    let (out, r) = forwarded(input).await;
    r.unwrap();
    let mut blocks = Vec::new();
    let mut dec = hpack::Decoder::new();
    let mut block = Vec::new();
    for (kind, flags, payload) in parse(&out[24..]) {
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

fn encoded(enc: &mut hpack::Encoder, authority: &[u8]) -> Vec<u8> {
    let req = request(authority);
    enc.encode(req.iter().map(|(n, v)| (*n, v.as_slice())))
}

#[tokio::test]
async fn a_percent_encoded_authority_becomes_localhost_and_the_rest_stays() {
    // Encoded as a client would, with its dynamic table (the second request indexes the
    // first's entries), Huffman-free; split over a CONTINUATION, padded.
    let mut enc = hpack::Encoder::new();
    let one = encoded(&mut enc, b"csi%2Fcsi.sock");
    let two = encoded(&mut enc, b"csi%2Fcsi.sock");
    let mut input = Vec::new();
    let mut padded = vec![3u8];
    padded.extend_from_slice(&one[..4]);
    padded.extend_from_slice(&[0, 0, 0]);
    input.extend(headers_frame(PADDED, 1, &padded));
    input.extend(continuation(END_HEADERS, 1, &one[4..]));
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
        let want: headers::Headers = request(b"localhost")
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
async fn a_request_without_authority_gets_none() {
    let mut enc = hpack::Encoder::new();
    let headers: Vec<(&[u8], &[u8])> = vec![(b":method", b"POST"), (b"x-big", &[b'x'; 16_000])];
    let block = enc.encode(headers.iter().copied());
    let mut input = headers_frame(0, 1, &block[..10_000]);
    input.extend(continuation(END_HEADERS, 1, &block[10_000..]));
    let (_, blocks) = relayed(&input).await;
    let want: headers::Headers = headers
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect();
    assert_eq!(blocks, vec![want]);
}

#[tokio::test]
async fn a_block_that_does_not_decode_is_a_compression_error() {
    let r = refusal(&headers_frame(
        END_HEADERS,
        1,
        &[0xff, 0xff, 0xff, 0xff, 0xff],
    ))
    .await;
    assert_eq!(r.code, COMPRESSION_ERROR, "{r:?}");
}

#[tokio::test]
async fn a_frame_over_the_limit_is_refused_before_its_payload_is_read() {
    // A 16 MiB - 1 length and not a byte of payload: the old relay waited for it.
    let r = refusal(&[0xff, 0xff, 0xff, 0x0, 0x0, 0, 0, 0, 1]).await;
    assert_eq!(r.code, FRAME_SIZE_ERROR, "{r:?}");
    assert!(r.what.contains("16777215"), "{}", r.what);
    // At the limit it is read.
    let mut input = Vec::new();
    frame(&mut input, 0x0, 0, 1u32.to_be_bytes(), &[0; MAX_FRAME]);
    forwarded(&input).await.1.unwrap();
}

#[tokio::test]
async fn a_continuation_flood_is_refused_at_the_ninth() {
    let mut enc = hpack::Encoder::new();
    let block = encoded(&mut enc, b"x");
    let mut input = headers_frame(0, 1, &block);
    for _ in 0..MAX_CONTINUATIONS - 1 {
        input.extend(continuation(0, 1, &[]));
    }
    let mut ok = input.clone();
    ok.extend(continuation(END_HEADERS, 1, &[]));
    assert_eq!(relayed(&ok).await.1.len(), 1, "8 CONTINUATIONs are taken");
    for _ in 0..1000 {
        input.extend(continuation(0, 1, &[]));
    }
    let r = refusal(&input).await;
    assert_eq!(r.code, ENHANCE_YOUR_CALM, "{r:?}");
}

#[tokio::test]
async fn a_block_over_32_kib_is_refused_before_it_is_decoded() {
    let mut input = headers_frame(0, 1, &[0x82; MAX_FRAME]);
    input.extend(continuation(0, 1, &[0x82; MAX_FRAME]));
    input.extend(continuation(END_HEADERS, 1, &[0x82]));
    let r = refusal(&input).await;
    assert_eq!(r.code, ENHANCE_YOUR_CALM, "{r:?}");
    assert!(r.what.contains("32768"), "{}", r.what);
}

#[tokio::test]
async fn a_refusal_names_the_last_stream_passed_on() {
    let mut enc = hpack::Encoder::new();
    let mut input = headers_frame(END_HEADERS, 1, &encoded(&mut enc, b"a"));
    input.extend(headers_frame(END_HEADERS, 5, &encoded(&mut enc, b"b")));
    // A table size update to 1 MiB.
    let mut update = hpack::encoder::encode_integer(1 << 20, 5);
    update[0] |= 0x20;
    input.extend(headers_frame(END_HEADERS, 7, &update));
    let r = refusal(&input).await;
    assert_eq!((r.code, r.last_stream), (COMPRESSION_ERROR, 5), "{r:?}");
}

#[tokio::test]
async fn the_client_over_a_limit_gets_a_goaway_and_the_server_an_end() {
    let (mut client, client_end) = tokio::io::duplex(1 << 16);
    let (server_end, mut server) = tokio::io::duplex(1 << 16);
    let relay = tokio::spawn(relay(client_end, server_end));
    // What the server says first reaches the client before the GOAWAY.
    let mut settings = Vec::new();
    frame(&mut settings, 0x4, 0, [0; 4], &[]);
    server.write_all(&settings).await.unwrap();
    let mut first = [0u8; 9];
    client.read_exact(&mut first).await.unwrap();
    assert_eq!(first[..], settings[..]);

    let mut enc = hpack::Encoder::new();
    let mut input = PREFACE.to_vec();
    input.extend(headers_frame(END_HEADERS, 3, &encoded(&mut enc, b"a")));
    input.extend([0x01, 0x00, 0x00, 0x0, 0x0, 0, 0, 0, 5]);
    client.write_all(&input).await.unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    let frames = parse(&rest);
    assert_eq!(frames.len(), 1, "{frames:?}");
    let (kind, flags, payload) = &frames[0];
    assert_eq!((*kind, *flags), (GOAWAY, 0));
    assert_eq!(
        payload[..8],
        [0, 0, 0, 3, 0, 0, 0, 6],
        "last stream 3, FRAME_SIZE_ERROR"
    );
    let debug = String::from_utf8_lossy(&payload[8..]);
    assert!(debug.contains("65536 bytes"), "{debug}");

    // The server had the preface and the request, then the end of the connection.
    let mut seen = Vec::new();
    server.read_to_end(&mut seen).await.unwrap();
    assert!(seen.starts_with(PREFACE));
    assert_eq!(parse(&seen[24..]).len(), 1, "the request's HEADERS");
    relay.await.unwrap();
}
