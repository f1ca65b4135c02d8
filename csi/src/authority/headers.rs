//! A client's header blocks: checked, decoded within bounds, and encoded again.
//!
//! The `hpack` 0.3 crate decodes (it knows Huffman and the tables), but it applies any dynamic
//! table size update, wherever it is in a block, and collects a block's whole header list
//! however large it decodes. So before a block reaches it, [`check`] walks the block's
//! instructions (integers and string lengths only, RFC 7541 §5, §6: nothing is decoded or
//! copied) and refuses a size update over [`MAX_TABLE`] or one after a header field; and
//! [`Decoder::decode`] counts the list as it comes out of the decoder and keeps nothing past
//! [`MAX_LIST`]. A walk of our own is smaller and safer than a decoder of our own: the crate's
//! table and Huffman code stay, and what it cannot bound never reaches it.

use std::borrow::Cow;

use super::{COMPRESSION_ERROR, ENHANCE_YOUR_CALM, Refusal};

/// The largest HPACK dynamic table a client may ask for: HTTP/2's default
/// SETTINGS_HEADER_TABLE_SIZE, which the server (h2) never raises.
pub const MAX_TABLE: usize = 4096;

/// The largest header list decoded, counted as SETTINGS_MAX_HEADER_LIST_SIZE counts it (name,
/// value and 32 octets an entry, RFC 9113 §6.5.2): the server's own limit (hyper's 16 KiB).
pub const MAX_LIST: usize = 16 << 10;

/// A decoded header list.
pub type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// One connection's HPACK decoding state.
pub struct Decoder {
    inner: hpack::Decoder<'static>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            inner: hpack::Decoder::new(),
        }
    }
}

impl Decoder {
    /// The header list of `block` (a whole header block), or why the connection must end.
    pub fn decode(&mut self, block: &[u8]) -> Result<Headers, Refusal> {
        check(block)?;
        let mut list = Vec::new();
        let mut size = 0usize;
        // The decoder is an old crate: should it panic on a hostile block, that ends this
        // connection, as a block that does not decode does, and nothing else.
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.inner
                .decode_with_cb(block, |name: Cow<[u8]>, value: Cow<[u8]>| {
                    // Every field is still decoded (the table must follow the block), but
                    // past the limit nothing is kept: a bomb's references cost no memory.
                    size = size.saturating_add(name.len() + value.len() + 32);
                    if size <= MAX_LIST {
                        list.push((name.into_owned(), value.into_owned()));
                    }
                })
        }))
        .map_err(|_| compression("a header block the decoder failed on".into()))?;
        decoded.map_err(|e| compression(format!("a header block does not decode: {e:?}")))?;
        if size > MAX_LIST {
            return Err(Refusal::new(
                ENHANCE_YOUR_CALM,
                format!(
                    "a header list of {size} bytes decoded, over the {MAX_LIST} the server takes"
                ),
            ));
        }
        Ok(list)
    }
}

/// Refuses a block with a dynamic table size update over [`MAX_TABLE`] (RFC 7541 §6.3: a
/// decoding error, COMPRESSION_ERROR in HTTP/2) or after a header field (§4.2: only at the
/// beginning of a block), or an instruction cut short.
pub fn check(block: &[u8]) -> Result<(), Refusal> {
    let mut at = 0;
    let mut fields = false;
    while let Some(rest) = block.get(at..).filter(|r| !r.is_empty()) {
        let first = rest[0];
        let used = if first & 0x80 != 0 {
            // 1xxxxxxx: an indexed field.
            integer(rest, 7)?.1
        } else if first & 0x40 != 0 {
            // 01xxxxxx: a literal with incremental indexing.
            literal(rest, 6)?
        } else if first & 0x20 != 0 {
            // 001xxxxx: a dynamic table size update.
            let (size, used) = integer(rest, 5)?;
            if fields {
                return Err(compression(
                    "a dynamic table size update after a header field".into(),
                ));
            }
            if size > MAX_TABLE {
                return Err(compression(format!(
                    "a dynamic table size update to {size} bytes, over the {MAX_TABLE} allowed"
                )));
            }
            used
        } else {
            // 0001xxxx or 0000xxxx: a literal never indexed, or without indexing.
            literal(rest, 4)?
        };
        fields |= first & 0xe0 != 0x20;
        at += used;
    }
    Ok(())
}

/// The length of the literal field at the start of `buf`: its name index (`prefix` bits), its
/// name when the index is 0, its value.
fn literal(buf: &[u8], prefix: u8) -> Result<usize, Refusal> {
    let (index, mut used) = integer(buf, prefix)?;
    if index == 0 {
        used += string(&buf[used..])?;
    }
    Ok(used + string(&buf[used..])?)
}

/// The length of the string literal at the start of `buf` (its length, then its octets).
fn string(buf: &[u8]) -> Result<usize, Refusal> {
    let (len, used) = integer(buf, 7)?;
    match used.checked_add(len) {
        Some(end) if end <= buf.len() => Ok(end),
        _ => Err(compression(format!(
            "a string of {len} bytes past the end of its header block"
        ))),
    }
}

/// The integer at the start of `buf` with a `prefix`-bit prefix (RFC 7541 §5.1), and the
/// octets it took. At most 4 octets follow the prefix, as the `hpack` crate takes: far more
/// than any length in a block this relay accepts.
fn integer(buf: &[u8], prefix: u8) -> Result<(usize, usize), Refusal> {
    let cut = || compression("an integer cut short at the end of its header block".into());
    let mask = (1u8 << prefix) - 1;
    let mut value = usize::from(*buf.first().ok_or_else(cut)? & mask);
    if value < usize::from(mask) {
        return Ok((value, 1));
    }
    for (i, &b) in buf.iter().enumerate().skip(1).take(4) {
        value += usize::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    if buf.len() > 5 {
        Err(compression("an integer longer than 5 octets".into()))
    } else {
        Err(cut())
    }
}

fn compression(what: String) -> Refusal {
    Refusal::new(COMPRESSION_ERROR, what)
}

/// `headers` with `:authority` set to `authority` (left out when the client sent none),
/// encoded as literals without indexing: the server's decoder table stays empty.
pub fn rewrite(headers: Headers, authority: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let value = if name == b":authority" {
            authority
        } else {
            &value
        };
        // Literal header field without indexing, new name (RFC 7541 6.2.2).
        out.push(0);
        encode_string(&mut out, &name);
        encode_string(&mut out, value);
    }
    out
}

/// A string literal without Huffman coding: its length (7-bit prefix integer), then it.
fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend(hpack::encoder::encode_integer(s.len(), 7));
    out.extend_from_slice(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 7-bit-prefix string literal.
    fn raw(s: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_string(&mut out, s);
        out
    }

    #[test]
    fn integers_decode_as_rfc_7541_c_1_says() {
        assert_eq!(integer(&[10], 5).unwrap(), (10, 1));
        assert_eq!(integer(&[31, 154, 10], 5).unwrap(), (1337, 3));
        assert_eq!(integer(&[0xff, 0], 7).unwrap(), (127, 2));
        assert_eq!(integer(&[31], 5).unwrap_err().code, COMPRESSION_ERROR);
        assert_eq!(integer(&[], 5).unwrap_err().code, COMPRESSION_ERROR);
        let long = [31, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(integer(&long, 5).unwrap_err().what.contains("5 octets"));
    }

    #[test]
    fn a_size_update_up_to_4096_at_the_start_is_taken() {
        // 0x3f 0xe1 0x1f: 31 + 0x61 + (0x1f << 7) = 4096; then an indexed field (:method GET).
        check(&[0x3f, 0xe1, 0x1f, 0x82]).unwrap();
        check(&[0x20, 0x3f, 0xe1, 0x1f, 0x82]).unwrap();
    }

    #[test]
    fn a_size_update_over_4096_or_after_a_field_is_a_compression_error() {
        // 4097.
        let e = check(&[0x3f, 0xe2, 0x1f, 0x82]).unwrap_err();
        assert_eq!(e.code, COMPRESSION_ERROR);
        assert!(e.what.contains("4097"), "{}", e.what);
        // 1 MiB.
        let mut mib = hpack::encoder::encode_integer(1 << 20, 5);
        mib[0] |= 0x20;
        assert_eq!(check(&mib).unwrap_err().code, COMPRESSION_ERROR);
        // 0 is fine at the start, but not after a field, literal or indexed.
        assert!(check(&[0x82, 0x20]).unwrap_err().what.contains("after"));
        let mut lit = vec![0x00];
        lit.extend(raw(b"a"));
        lit.extend(raw(b"b"));
        lit.push(0x20);
        assert!(check(&lit).unwrap_err().what.contains("after"));
    }

    #[test]
    fn a_string_past_the_block_is_a_compression_error() {
        let mut b = vec![0x40];
        b.extend(raw(b"name"));
        b.push(10);
        b.extend(b"short");
        let e = check(&b).unwrap_err();
        assert_eq!(e.code, COMPRESSION_ERROR);
        // The hpack crate panics on a size update cut short; it never sees one.
        assert_eq!(check(&[0x3f]).unwrap_err().code, COMPRESSION_ERROR);
        let mut d = Decoder::default();
        assert_eq!(d.decode(&[0x3f, 0xff]).unwrap_err().code, COMPRESSION_ERROR);
    }

    #[test]
    fn a_list_over_16_kib_decoded_from_a_small_block_is_refused() {
        let mut d = Decoder::default();
        // A 4 KiB entry in the table (4000 + 1 + 32 = 4033 bytes), then 5 references to it:
        // 20 KiB decoded from 4 KiB and 5 bytes.
        let mut block = vec![0x40];
        block.extend(raw(b"x"));
        block.extend(raw(&[b'v'; 4000]));
        assert_eq!(d.decode(&block).unwrap().len(), 1);
        let e = d.decode(&[0xbe; 5]).unwrap_err();
        assert_eq!(e.code, ENHANCE_YOUR_CALM);
        assert!(e.what.contains("20165"), "{}", e.what);
        // 4 references are 16132 bytes: taken.
        let mut d = Decoder::default();
        d.decode(&block).unwrap();
        assert_eq!(d.decode(&[0xbe; 4]).unwrap().len(), 4);
    }

    #[test]
    fn rewriting_replaces_only_the_authority() {
        let headers = vec![
            (b":authority".to_vec(), b"csi%2Fcsi.sock".to_vec()),
            (b"x".to_vec(), b"y".to_vec()),
        ];
        let out = rewrite(headers, b"localhost");
        let back = hpack::Decoder::new().decode(&out).unwrap();
        assert_eq!(
            back,
            vec![
                (b":authority".to_vec(), b"localhost".to_vec()),
                (b"x".to_vec(), b"y".to_vec())
            ]
        );
    }
}
