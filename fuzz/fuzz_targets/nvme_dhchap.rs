//! DH-HMAC-CHAP secrets in their `DHHC-1:` form: what a user or a stage secret gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lunkit::Error;
use lunkit::nvme::dhchap::Secret;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match s.parse::<Secret>() {
        Ok(secret) => {
            assert_eq!(secret.expose(), s);
            assert!(s.starts_with("DHHC-1:0") && s.ends_with(':'));
            assert!([32, 48, 64].contains(&secret.key_len()));
            // The key never shows in the debug form.
            let b64 = s.split(':').nth(2).unwrap();
            assert!(!format!("{secret:?}").contains(b64));
        }
        Err(e) => {
            // An error never carries the input: it may be most of a secret.
            assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
            let msg = e.to_string();
            if s.len() > 12 {
                assert!(!msg.contains(s), "{msg}");
            }
        }
    }
});
