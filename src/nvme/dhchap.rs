//! DH-HMAC-CHAP secrets in their text form, `DHHC-1:<hh>:<base64 of key and CRC>:` (NVMe
//! Base Specification 2.0, "Secret representation"; what `nvme gen-dhchap-key` prints and
//! the kernel's `dhchap_secret=` and `dhchap_ctrl_secret=` options take).
//!
//! A secret is checked here before anything is written anywhere: the kernel would refuse a
//! wrong length or CRC only after the connect began, with a log line and `EINVAL`; a typo
//! in a stage secret should instead be an error that says what is wrong with it. No error,
//! `Debug` output or message of this module contains any part of the key.
//!
//! ```
//! use lunkit::nvme::dhchap::{Secret, Transform};
//!
//! let s: Secret = "DHHC-1:00:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWYOtVl3:".parse()?;
//! assert_eq!((s.transform(), s.key_len()), (Transform::None, 32));
//! assert_eq!(format!("{s:?}"), "Secret { transform: None, key_len: 32, .. }");
//! # Ok::<(), lunkit::Error>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// How the key is transformed before use (`<hh>`): not at all, or by HMAC with the host's
/// NQN under one of three hashes, which then fixes the key's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transform {
    /// `00`: used as it is; 32, 48 or 64 bytes.
    None,
    /// `01`: SHA-256; 32 bytes.
    Sha256,
    /// `02`: SHA-384; 48 bytes.
    Sha384,
    /// `03`: SHA-512; 64 bytes.
    Sha512,
}

/// A DH-HMAC-CHAP secret, checked: the form, the transform, the key's length and its CRC.
///
/// It keeps the text, to be written as it was given; it has no `Display`, and its `Debug`
/// shows only the transform and the key's length. The text is overwritten when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    text: String,
    transform: Transform,
    key_len: usize,
}

impl Secret {
    /// The transform (`<hh>`).
    pub fn transform(&self) -> Transform {
        self.transform
    }

    /// The key's length in bytes: 32, 48 or 64.
    pub fn key_len(&self) -> usize {
        self.key_len
    }

    /// The text to write to the kernel, as it was given. Never log it.
    pub fn expose(&self) -> &str {
        &self.text
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("transform", &self.transform)
            .field("key_len", &self.key_len)
            .finish_non_exhaustive()
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        let mut bytes = std::mem::take(&mut self.text).into_bytes();
        bytes.fill(0);
        // Keeps the compiler from dropping the writes to memory about to be freed.
        std::hint::black_box(&bytes);
    }
}

/// What an error shows in place of the secret.
const WITHHELD: &str = "(withheld)";

fn invalid(reason: &'static str) -> Error {
    Error::invalid("DH-HMAC-CHAP secret", WITHHELD, reason)
}

impl FromStr for Secret {
    type Err = Error;

    fn from_str(s: &str) -> Result<Secret> {
        let body = s
            .strip_prefix("DHHC-1:")
            .ok_or_else(|| invalid("does not start with DHHC-1:"))?;
        let (hh, rest) = body
            .split_once(':')
            .ok_or_else(|| invalid("expected DHHC-1:<hh>:<base64>:"))?;
        let transform = match hh {
            "00" => Transform::None,
            "01" => Transform::Sha256,
            "02" => Transform::Sha384,
            "03" => Transform::Sha512,
            _ => return Err(invalid("the hash id is not 00, 01, 02 or 03")),
        };
        let b64 = rest
            .strip_suffix(':')
            .ok_or_else(|| invalid("does not end with ':'"))?;
        let mut raw = base64_decode(b64).ok_or_else(|| invalid("the key is not base64"))?;
        let checked = check(&raw, transform);
        raw.fill(0);
        std::hint::black_box(&raw);
        let key_len = checked?;
        Ok(Secret {
            text: s.to_owned(),
            transform,
            key_len,
        })
    }
}

/// The key's length, once `raw` (key, then its CRC-32 little-endian) is whole.
fn check(raw: &[u8], transform: Transform) -> Result<usize> {
    let key_len = raw.len().saturating_sub(4);
    let wanted = match transform {
        Transform::None => [32, 48, 64].contains(&key_len),
        Transform::Sha256 => key_len == 32,
        Transform::Sha384 => key_len == 48,
        Transform::Sha512 => key_len == 64,
    };
    if !wanted {
        return Err(invalid(
            "the key is not 32, 48 or 64 bytes, or not the length its hash id needs",
        ));
    }
    let (key, crc) = raw.split_at(key_len);
    if crc32(key).to_le_bytes() != crc {
        return Err(invalid("the key's CRC-32 does not match: mistyped or cut"));
    }
    Ok(key_len)
}

/// CRC-32 as zlib and the kernel's `~crc32_le(~0, …)` compute it (reflected, polynomial
/// 0x04C11DB7). Keys are at most 64 bytes: bit by bit is fast enough.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// RFC 4648 base64 with the standard alphabet; the `=` padding may be left out. `None` for
/// any other character, a misplaced `=`, or bits left over that are not zero.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    let data = s
        .strip_suffix(b"==")
        .or_else(|| s.strip_suffix(b"="))
        .unwrap_or(s);
    if s.len() != data.len() && s.len() % 4 != 0 {
        return None;
    }
    if data.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in data {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (acc == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `DHHC-1:<hh>:<base64(key ‖ crc)>:` for `key`, written here from the specification's
    /// description.
    fn secret_of(hh: &str, key: &[u8]) -> String {
        let mut raw = key.to_vec();
        raw.extend_from_slice(&crc32(key).to_le_bytes());
        format!("DHHC-1:{hh}:{}:", base64_encode(&raw))
    }

    fn base64_encode(b: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for chunk in b.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &x)| n | u32::from(x) << (16 - 8 * i));
            for i in 0..4 {
                if i <= chunk.len() {
                    s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }

    #[test]
    fn crc32_is_zlib_s() {
        // python3 -c 'import zlib; print(hex(zlib.crc32(b"123456789")))'
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn base64_round_trips_and_refuses_what_is_not_base64() {
        for len in 0..70 {
            let b: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let s = base64_encode(&b);
            assert_eq!(base64_decode(&s).as_deref(), Some(&b[..]), "{s}");
            assert_eq!(
                base64_decode(s.trim_end_matches('=')).as_deref(),
                Some(&b[..])
            );
        }
        for bad in ["A", "AB=C", "AB*D", "AB==AB==", "AB=", "AR==", "QUJD=="] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn good_secrets_of_every_length_and_transform_parse() {
        let key = |n: usize| -> Vec<u8> { (0..n).map(|i| (i * 7 + 3) as u8).collect() };
        for (hh, n, t) in [
            ("00", 32, Transform::None),
            ("00", 48, Transform::None),
            ("00", 64, Transform::None),
            ("01", 32, Transform::Sha256),
            ("02", 48, Transform::Sha384),
            ("03", 64, Transform::Sha512),
        ] {
            let text = secret_of(hh, &key(n));
            let s: Secret = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                (s.transform(), s.key_len(), s.expose()),
                (t, n, text.as_str())
            );
        }
    }

    /// Printed by nvme-cli 2.3 (`nvme gen-dhchap-key --hmac=H [--key-length=N]`, Debian 12),
    /// random keys: the form as the tool users take their secrets from writes it.
    const NVME_CLI: [(&str, Transform, usize); 6] = [
        (
            "DHHC-1:00:Oi/HuU3nQlPSUMAHy9mtdKz0a+xVpewZQUdLbkIwufoPetit:",
            Transform::None,
            32,
        ),
        (
            "DHHC-1:01:09GFUL+L04EJzFZN2elQGibBeBw1RuITyd7jlFaOZAJwwOLq:",
            Transform::Sha256,
            32,
        ),
        (
            "DHHC-1:02:qsB+HoiBIHLENgMh7Azb0yY7CSO1/fBCrqiqru1/4OXqsdkcG+UeondUvX166gT7al+LeQ==:",
            Transform::Sha384,
            48,
        ),
        (
            "DHHC-1:03:e3SLncV3McPxpCZVssO3ggFFM8dz/YzWGc/C5z9/ia19kzqfgooARtT+juhqpgEX2QvvlnYf7zFWFtGAh4XIfZuHY0E=:",
            Transform::Sha512,
            64,
        ),
        (
            "DHHC-1:00:nRcjcb++d3gnxKXyTHhURuGuzVRhRrHcFfYZAsASgBF2izj2gmSFi5aT+fKmE2HpG8pBSQ==:",
            Transform::None,
            48,
        ),
        (
            "DHHC-1:00:Q/TiNw+Mmm3smmWP/0FZ3ie4BiYofQMQGRf9Dey8fWdiA3qkqVvY+y1yV3ZJVrCqaIY4I91SwthQIG6Q5Zl0Ojo1IJ0=:",
            Transform::None,
            64,
        ),
    ];

    #[test]
    fn nvme_cli_s_secrets_parse() {
        for (text, t, n) in NVME_CLI {
            let s: Secret = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((s.transform(), s.key_len()), (t, n), "{text}");
            // One character changed in the key: the CRC catches it.
            let mut typo = text.to_owned();
            let c = if &typo[14..15] == "A" { "B" } else { "A" };
            typo.replace_range(14..15, c);
            assert!(typo.parse::<Secret>().is_err(), "{typo}");
        }
    }

    #[test]
    fn the_module_s_example_is_what_nvme_gen_dhchap_key_would_print() {
        let s = secret_of("00", b"0123456789abcdef0123456789abcdef");
        assert_eq!(
            s,
            "DHHC-1:00:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWYOtVl3:"
        );
    }

    #[test]
    fn bad_secrets_are_refused_saying_why_and_never_showing_the_key() {
        let key: Vec<u8> = (0..32).collect();
        let good = secret_of("01", &key);
        let mut flipped = key.clone();
        flipped[5] ^= 1;
        let bad_crc = {
            let mut raw = flipped.clone();
            raw.extend_from_slice(&crc32(&key).to_le_bytes());
            format!("DHHC-1:01:{}:", base64_encode(&raw))
        };
        let cases = [
            (bad_crc.as_str(), "CRC-32"),
            (&secret_of("02", &key), "length its hash id needs"),
            (&secret_of("00", &key[..31]), "not 32, 48 or 64"),
            (&good.replace("DHHC-1:01:", "DHHC-1:04:"), "hash id"),
            (&good.replace("DHHC-1:01:", "DHHC-1:1:"), "hash id"),
            (&good.replace("DHHC-1", "DHHC-2"), "DHHC-1:"),
            (good.trim_end_matches(':'), "end with ':'"),
            (&good.replace('A', "*"), "not base64"),
            ("DHHC-1:00", "expected DHHC-1:<hh>:<base64>:"),
            ("", "DHHC-1:"),
        ];
        for (text, why) in cases {
            let e = text.parse::<Secret>().unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(why), "{text}: {msg}");
            assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
            if let Some(b64) = text.split(':').nth(2).filter(|b| b.len() > 8) {
                assert!(!msg.contains(b64), "{msg}");
                assert!(!format!("{e:?}").contains(b64), "{e:?}");
            }
        }
        let s: Secret = good.parse().unwrap();
        assert!(!format!("{s:?}").contains(good.split(':').nth(2).unwrap()));
    }
}
