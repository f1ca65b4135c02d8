//! The node's topology (`--topology KEY=VALUE`), as NodeGetInfo reports it in
//! `accessible_topology`, checked against the CSI specification's rules for `Topology` keys
//! and values (which Kubernetes' label keys and values also satisfy):
//!
//! - a key is an optional prefix and `/`, then a name;
//! - the name: 1 to 63 characters, letters, digits, `-`, `_` and `.`, starting and ending
//!   with a letter or digit;
//! - the prefix: 1 to 63 characters in domain name notation (DNS labels of lower-case
//!   letters, digits and `-` separated by `.`, each starting and ending with a letter or
//!   digit). Kubernetes allows a prefix of up to 253 characters; CSI allows 63, so 63 it is;
//! - a value: 1 to 63 characters, as a name (CSI wants at least one; Kubernetes would take
//!   an empty label value);
//! - keys are case-insensitive (`Zone` and `zone` may not both be given), and when one key
//!   has a prefix every key has the same prefix.

use std::collections::BTreeMap;

/// The longest key name, prefix and value.
pub const MAX_LEN: usize = 63;

/// Whether `s` is a name or value: 1 to 63 of `[A-Za-z0-9_.-]`, alphanumeric at both ends.
fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LEN
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Whether `s` is a key prefix: at most 63 characters of lower-case DNS labels.
fn is_prefix(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LEN
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// The prefix of a key, if it has one.
fn prefix_of(key: &str) -> Option<&str> {
    key.split_once('/').map(|(p, _)| p)
}

/// Checks one key; says what is wrong.
pub fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if !is_prefix(p) {
            return Err(format!(
                "topology key {key:?}: the prefix {p:?} is not at most {MAX_LEN} characters of \
                 lower-case DNS labels (letters, digits and '-', separated by '.')"
            ));
        }
    }
    if !is_name(name) {
        return Err(format!(
            "topology key {key:?}: the name {name:?} is not 1 to {MAX_LEN} letters, digits, \
             '-', '_' or '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// Checks one value; says what is wrong.
pub fn check_value(key: &str, value: &str) -> Result<(), String> {
    if is_name(value) {
        Ok(())
    } else {
        Err(format!(
            "topology value {value:?} of {key:?} is not 1 to {MAX_LEN} letters, digits, '-', \
             '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

/// Parses one `KEY=VALUE` (for the command line).
pub fn parse_segment(s: &str) -> Result<(String, String), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    check_key(key)?;
    check_value(key, value)?;
    Ok((key.to_owned(), value.to_owned()))
}

/// The segments of `pairs` once every key and value is valid, no key is given twice (in any
/// case), and the keys share one prefix or none has a prefix.
pub fn segments(pairs: &[(String, String)]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (key, value) in pairs {
        check_key(key)?;
        check_value(key, value)?;
        if let Some(other) = out.keys().find(|k: &&String| k.eq_ignore_ascii_case(key)) {
            return Err(format!(
                "topology key {key:?} is given twice ({other:?}; keys are case-insensitive)"
            ));
        }
        out.insert(key.clone(), value.clone());
    }
    let prefixes: std::collections::BTreeSet<Option<&str>> =
        out.keys().map(|k| prefix_of(k)).collect();
    if prefixes.len() > 1 {
        let shown: Vec<String> = prefixes
            .iter()
            .map(|p| p.map_or_else(|| "(none)".to_owned(), |p| format!("{p:?}")))
            .collect();
        return Err(format!(
            "topology keys must all have the same prefix (CSI), and these have {}",
            shown.join(", ")
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn kubernetes_and_csi_style_keys_are_taken() {
        let s = segments(&pairs(&[
            ("topology.kubernetes.io/zone", "eu-west-1a"),
            ("topology.kubernetes.io/region", "eu-west-1"),
        ]))
        .unwrap();
        assert_eq!(s.len(), 2);
        assert!(segments(&pairs(&[("zone", "Z1"), ("rack", "r_3.b")])).is_ok());
        assert_eq!(
            parse_segment("csi.lunkit.invalid/rack=R3").unwrap(),
            ("csi.lunkit.invalid/rack".to_owned(), "R3".to_owned())
        );
        let name = "a".repeat(MAX_LEN);
        assert!(parse_segment(&format!("{name}={name}")).is_ok());
        let prefix = format!("{}.b", "a".repeat(MAX_LEN - 2));
        assert!(parse_segment(&format!("{prefix}/z=1")).is_ok());
    }

    #[test]
    fn bad_keys_and_values_are_refused_naming_them() {
        let long = "a".repeat(MAX_LEN + 1);
        let long_prefix = format!("{}.b", "a".repeat(MAX_LEN - 1));
        for bad in [
            "zone".to_owned(),
            "=Z1".to_owned(),
            "zone=".to_owned(),
            "bad key=Z1".to_owned(),
            "-zone=Z1".to_owned(),
            "zone-=Z1".to_owned(),
            "/zone=Z1".to_owned(),
            "a/b/c=Z1".to_owned(),
            "Example.com/zone=Z1".to_owned(),
            "example..com/zone=Z1".to_owned(),
            "-example.com/zone=Z1".to_owned(),
            "example_com/zone=Z1".to_owned(),
            "example.com/=Z1".to_owned(),
            format!("{long}=Z1"),
            format!("{long_prefix}/zone=Z1"),
            format!("zone={long}"),
            "zone=Z 1".to_owned(),
            "zone=-Z1".to_owned(),
            "zone=Z1.".to_owned(),
        ] {
            let e = parse_segment(&bad).unwrap_err();
            assert!(
                e.contains("topology") || e.contains("KEY=VALUE"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn keys_are_case_insensitive_and_share_one_prefix() {
        let e = segments(&pairs(&[("zone", "Z1"), ("Zone", "Z2")])).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
        let e = segments(&pairs(&[("a.io/zone", "Z1"), ("b.io/rack", "R1")])).unwrap_err();
        assert!(e.contains("same prefix"), "{e}");
        let e = segments(&pairs(&[("a.io/zone", "Z1"), ("rack", "R1")])).unwrap_err();
        assert!(e.contains("same prefix"), "{e}");
    }
}
