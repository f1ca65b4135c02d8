//! `lunkit watch --json`: one document per line, a kernel uevent or a note that some were
//! lost.

use std::collections::BTreeMap;

use lunkit::uevent::Uevent;
use serde::Serialize;

use super::SCHEMA_VERSION;

/// One kernel uevent.
#[derive(Debug, Serialize)]
pub struct Event {
    pub version: u32,
    /// `add`, `remove`, `change`…
    pub action: String,
    pub devpath: String,
    pub subsystem: Option<String>,
    pub seqnum: u64,
    /// Every `KEY=VALUE` of the event, sorted by key (a repeated key keeps its last value).
    pub env: BTreeMap<String, String>,
}

/// Events were lost: the socket's receive queue overflowed.
#[derive(Debug, Serialize)]
pub struct Overflow {
    pub version: u32,
    /// Always `true`: a reader tells this line from an event by its presence.
    pub overflow: bool,
}

impl From<&Uevent> for Event {
    fn from(ev: &Uevent) -> Self {
        Event {
            version: SCHEMA_VERSION,
            action: ev.action.as_str().to_owned(),
            devpath: ev.devpath.clone(),
            subsystem: ev.subsystem.clone(),
            seqnum: ev.seqnum,
            env: ev.env.iter().cloned().collect(),
        }
    }
}

impl Overflow {
    pub fn new() -> Self {
        Overflow {
            version: SCHEMA_VERSION,
            overflow: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::{Layout, to_text};
    use serde_json::json;

    #[test]
    fn an_event_carries_its_environment_as_an_object() {
        let datagram = b"add@/devices/virtual/block/loop0\0ACTION=add\0DEVPATH=/devices/virtual/block/loop0\0SUBSYSTEM=block\0SEQNUM=1234\0MAJOR=7\0MINOR=0\0";
        let ev = Uevent::parse(datagram).expect("a kernel datagram parses");
        let v = serde_json::to_value(Event::from(&ev)).unwrap();
        assert_eq!(v["version"], json!(1));
        assert_eq!(v["action"], json!("add"));
        assert_eq!(v["devpath"], json!("/devices/virtual/block/loop0"));
        assert_eq!(v["subsystem"], json!("block"));
        assert_eq!(v["seqnum"], json!(1234));
        assert_eq!(v["env"]["MAJOR"], json!("7"));
        assert_eq!(v["env"]["SUBSYSTEM"], json!("block"));
    }

    #[test]
    fn an_overflow_is_a_line_of_its_own() {
        assert_eq!(
            to_text(&Overflow::new(), Layout::Line),
            r#"{"version":1,"overflow":true}"#
        );
    }
}
