//! `lunkit pr show --json`, and the other `lunkit pr` commands' `--json`.

use std::time::Duration;

use lunkit::block::BlockNode;
use lunkit::pr::{Key, PathState};
use serde::Serialize;

use super::SCHEMA_VERSION;

#[derive(Debug, Serialize)]
pub struct Show {
    pub version: u32,
    /// The device asked about (`dm-0`, `sdc`).
    pub device: String,
    /// Its device number, `MAJOR:MINOR`.
    pub dev: String,
    /// Every path (a map's; a lone disk is its own one path).
    pub paths: Vec<Path>,
    pub elapsed_us: u64,
}

/// What `register`, `unregister`, `reserve`, `release`, `preempt` and `clear` did.
#[derive(Debug, Serialize)]
pub struct Done {
    pub version: u32,
    /// The device (`dm-0`, `sdc`).
    pub device: String,
    /// Its device number, `MAJOR:MINOR`.
    pub dev: String,
    /// The key the command was sent with, `0x` and 16 hex digits.
    pub key: String,
    /// What was done, as the command prints it without `--json` (`registered`,
    /// `reserved (write-exclusive-registrants-only)`...).
    pub done: String,
    pub elapsed_us: u64,
}

impl Done {
    pub fn new(node: &BlockNode, key: Key, done: &str, elapsed: Duration) -> Done {
        Done {
            version: SCHEMA_VERSION,
            device: node.name.clone(),
            dev: node.dev.to_string(),
            key: key.to_string(),
            done: done.to_owned(),
            elapsed_us: super::micros(elapsed),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Path {
    /// The path's disk (`sdc`).
    pub path: String,
    pub dev: String,
    /// PRGENERATION from READ KEYS; `null` when it could not be read.
    pub generation: Option<u32>,
    /// Every registered key (one per registered I_T nexus), `0x` and 16 hex digits.
    pub keys: Vec<String>,
    /// The reservation; `null` when none is held or it could not be read.
    pub reservation: Option<Reservation>,
    /// Why the path could not be read; `null` when it was.
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Reservation {
    /// The holder's key (0 under an all-registrants type).
    pub key: String,
    /// `write-exclusive-registrants-only`...; `null` for a code that is no SPC-3 type.
    #[serde(rename = "type")]
    pub kind: Option<&'static str>,
    /// The SPC TYPE code.
    pub type_code: u8,
    pub scope: u8,
}

impl Show {
    pub fn new(node: &BlockNode, paths: &[PathState], elapsed: Duration) -> Show {
        Show {
            version: SCHEMA_VERSION,
            device: node.name.clone(),
            dev: node.dev.to_string(),
            paths: paths.iter().map(Path::from).collect(),
            elapsed_us: super::micros(elapsed),
        }
    }
}

impl From<&PathState> for Path {
    fn from(p: &PathState) -> Path {
        let keys = p.keys.as_ref().ok();
        let reservation = p.reservation.as_ref().ok().and_then(|r| r.holder);
        let error = match (&p.keys, &p.reservation) {
            (Err(e), _) | (_, Err(e)) => Some(e.to_string()),
            _ => None,
        };
        Path {
            path: p.path.name.clone(),
            dev: p.path.dev.to_string(),
            generation: keys.map(|k| k.generation),
            keys: keys.map_or_else(Vec::new, |k| k.keys.iter().map(|k| k.to_string()).collect()),
            reservation: reservation.map(|h| Reservation {
                key: h.key.to_string(),
                kind: h.kind.map(|t| t.as_str()),
                type_code: h.type_code,
                scope: h.scope,
            }),
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lunkit::DevNum;
    use lunkit::pr::{ReadKeys, ReadReservation};
    use serde_json::json;

    #[test]
    fn a_path_shows_its_keys_and_holder_and_a_failed_one_its_error() {
        let disk = |name: &str, minor| BlockNode {
            name: name.into(),
            dev: DevNum { major: 8, minor },
            path: format!("/dev/{name}").into(),
        };
        let mut keys = 7u32.to_be_bytes().to_vec();
        keys.extend(16u32.to_be_bytes());
        keys.extend(0xau64.to_be_bytes());
        keys.extend(0xbu64.to_be_bytes());
        let mut res = 7u32.to_be_bytes().to_vec();
        res.extend(16u32.to_be_bytes());
        res.extend(0xau64.to_be_bytes());
        res.extend([0, 0, 0, 0, 0, 5, 0, 0]);
        let ok = PathState {
            path: disk("sdc", 32),
            keys: Ok(ReadKeys::parse(&keys).unwrap()),
            reservation: Ok(ReadReservation::parse(&res).unwrap()),
        };
        let down = PathState {
            path: disk("sdd", 48),
            keys: Err(lunkit::Error::NotFound {
                what: "sdd is gone".into(),
            }),
            reservation: Err(lunkit::Error::NotFound {
                what: "sdd is gone".into(),
            }),
        };
        let map = BlockNode {
            name: "dm-0".into(),
            dev: DevNum {
                major: 253,
                minor: 0,
            },
            path: "/dev/dm-0".into(),
        };
        let doc = Show::new(&map, &[ok, down], Duration::from_micros(5));
        assert_eq!(
            serde_json::to_value(&doc).unwrap(),
            json!({
                "version": 1, "device": "dm-0", "dev": "253:0", "elapsed_us": 5,
                "paths": [
                    {"path": "sdc", "dev": "8:32", "generation": 7,
                     "keys": ["0x000000000000000a", "0x000000000000000b"],
                     "reservation": {"key": "0x000000000000000a",
                                     "type": "write-exclusive-registrants-only",
                                     "type_code": 5, "scope": 0},
                     "error": null},
                    {"path": "sdd", "dev": "8:48", "generation": null, "keys": [],
                     "reservation": null, "error": "sdd is gone"}
                ]
            })
        );
    }
}
