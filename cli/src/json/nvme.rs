//! `lunkit nvme connect --json` and `lunkit nvme disconnect --json`: [`Report`]s of the
//! subsystem (and portal) asked for; `lunkit nvme rescan --json`: the controllers asked.

use std::time::Duration;

use lunkit::nvme::{Connected, Disconnected};
use serde::Serialize;

use super::{Report, SCHEMA_VERSION, micros};

/// `lunkit nvme connect --json`.
pub type Connect = Report<Portal, Controller>;
/// `lunkit nvme disconnect --json`.
pub type Disconnect = Report<Subsystem, Disconnection>;

/// What `connect` was asked for, as given on the command line (also when it did not parse).
#[derive(Debug, Serialize)]
pub struct Portal {
    pub nqn: String,
    pub traddr: String,
    pub trsvcid: String,
}

/// What `disconnect` was asked for, as given on the command line.
#[derive(Debug, Serialize)]
pub struct Subsystem {
    pub nqn: String,
}

/// The controller a connect made or found.
#[derive(Debug, Serialize)]
pub struct Controller {
    /// `nvme0`.
    pub controller: String,
    pub cntlid: u16,
    /// Whether it was there already (nothing was written).
    pub existing: bool,
    /// Its state when the call returned (`live`, `connecting`).
    pub state: Option<String>,
    /// The library's own time.
    pub elapsed_us: u64,
}

/// What a disconnect took away.
#[derive(Debug, Serialize)]
pub struct Disconnection {
    /// The controllers deleted; empty when none was connected.
    pub controllers: Vec<String>,
    /// The namespace devices checked and flushed.
    pub namespaces: Vec<String>,
    pub elapsed_us: u64,
}

/// The controllers a rescan asked to look for namespaces.
#[derive(Debug, Serialize)]
pub struct Rescan {
    pub version: u32,
    pub nqn: String,
    /// Every live controller of the subsystem, each asked once.
    pub controllers: Vec<String>,
    pub elapsed_us: u64,
}

impl Rescan {
    pub fn new(nqn: &str, controllers: Vec<String>, elapsed: Duration) -> Self {
        Rescan {
            version: SCHEMA_VERSION,
            nqn: nqn.to_owned(),
            controllers,
            elapsed_us: micros(elapsed),
        }
    }
}

/// The report of a connect to `portal` that took `elapsed`.
pub fn connect(portal: Portal, result: &lunkit::Result<Connected>, elapsed: Duration) -> Connect {
    Report::new(portal, result, elapsed, |c| Controller {
        controller: c.controller.clone(),
        cntlid: c.cntlid,
        existing: c.existing,
        state: c.state.clone(),
        elapsed_us: micros(c.elapsed),
    })
}

/// The report of a disconnect of `nqn` that took `elapsed`.
pub fn disconnect(
    nqn: &str,
    result: &lunkit::Result<Disconnected>,
    elapsed: Duration,
) -> Disconnect {
    let subject = Subsystem {
        nqn: nqn.to_owned(),
    };
    Report::new(subject, result, elapsed, |d| Disconnection {
        controllers: d.controllers.clone(),
        namespaces: d.namespaces.clone(),
        elapsed_us: micros(d.elapsed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const NQN: &str = "nqn.2014-08.org.lunkit:lab";

    #[test]
    fn a_connect_names_the_portal_and_the_controller() {
        let portal = Portal {
            nqn: NQN.into(),
            traddr: "127.0.0.1".into(),
            trsvcid: "4420".into(),
        };
        let ok = Ok(Connected {
            controller: "nvme0".into(),
            cntlid: 3,
            existing: true,
            state: Some("live".into()),
            elapsed: Duration::from_micros(900),
        });
        let v = serde_json::to_value(connect(portal, &ok, Duration::from_micros(1000))).unwrap();
        assert_eq!(
            v,
            json!({
                "version": 1, "nqn": NQN, "traddr": "127.0.0.1", "trsvcid": "4420",
                "ok": true, "error": null, "elapsed_us": 1000,
                "result": {"controller": "nvme0", "cntlid": 3, "existing": true, "state": "live", "elapsed_us": 900},
            })
        );
    }

    #[test]
    fn a_refused_connect_keeps_what_was_typed() {
        let portal = Portal {
            nqn: NQN.into(),
            traddr: "not-an-address".into(),
            trsvcid: "0".into(),
        };
        let failed = Err(lunkit::Error::invalid("port", "0", "must be 1 to 65535"));
        let v = serde_json::to_value(connect(portal, &failed, Duration::ZERO)).unwrap();
        assert_eq!(v["traddr"], json!("not-an-address"));
        assert_eq!((&v["ok"], &v["result"]), (&json!(false), &Value::Null));
        assert!(v["error"].as_str().unwrap().contains("65535"));
    }

    #[test]
    fn a_rescan_lists_the_controllers_asked() {
        let doc = Rescan::new(
            NQN,
            vec!["nvme0".into(), "nvme1".into()],
            Duration::from_micros(8),
        );
        assert_eq!(
            serde_json::to_value(doc).unwrap(),
            json!({"version": 1, "nqn": NQN, "controllers": ["nvme0", "nvme1"], "elapsed_us": 8})
        );
    }

    #[test]
    fn a_disconnect_lists_what_it_took_away() {
        let ok = Ok(Disconnected {
            namespaces: vec!["nvme0n1".into()],
            controllers: vec!["nvme0".into(), "nvme1".into()],
            elapsed: Duration::from_micros(5),
        });
        let v = serde_json::to_value(disconnect(NQN, &ok, Duration::from_micros(6))).unwrap();
        assert_eq!(
            v,
            json!({
                "version": 1, "nqn": NQN, "ok": true, "error": null, "elapsed_us": 6,
                "result": {"controllers": ["nvme0", "nvme1"], "namespaces": ["nvme0n1"], "elapsed_us": 5},
            })
        );
    }
}
