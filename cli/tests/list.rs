//! `lunkit list` end to end on the FC fixture tree: the JSON contract and the exit codes.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn lunkit(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lunkit"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn json_has_the_documented_fields() {
    let root = fixture("fc");
    let out = lunkit(&["--root", root.to_str().unwrap(), "list", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["version"], 1);

    let devs = doc["scsi_devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2);
    assert_eq!(devs[0]["hctl"], "5:0:0:0");
    assert_eq!(devs[0]["block"], "sdc");
    assert_eq!(devs[0]["wwid"], "naa.600a098038303053453f463045727a41");
    assert_eq!(devs[0]["state"], "running");

    let maps = doc["multipath_maps"].as_array().unwrap();
    assert_eq!(maps.len(), 1);
    assert_eq!(maps[0]["name"], "mpathb");
    assert_eq!(maps[0]["dm"], "dm-0");
    assert_eq!(maps[0]["uuid"], "mpath-3600a098038303053453f463045727a41");
    assert_eq!(maps[0]["paths"], serde_json::json!(["sdc", "sdd"]));

    let rports = doc["fc_rports"].as_array().unwrap();
    assert_eq!(rports.len(), 4);
    assert_eq!(rports[0]["port_name"], "0x500a098188a8b1c1");
    assert_eq!(rports[0]["target"], "5:0:0");
    assert_eq!(rports[1]["scsi_target_id"], Value::Null);
    assert_eq!(doc["fc_hosts"][2]["port_state"], "Linkdown");
    assert_eq!(doc["iscsi_sessions"], serde_json::json!([]));
}

#[test]
fn tree_shows_paths_under_hosts_and_maps() {
    let root = fixture("fc");
    let out = lunkit(&["--root", root.to_str().unwrap(), "list"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
            .to_owned()
    };
    assert!(line("host5").contains("0x21000024ff3a0001"));
    let lun = line("5:0:0:0");
    assert!(lun.contains(" sdc ") && lun.contains("in mpathb"), "{lun}");
    assert!(lun.starts_with("│  └─ "), "LUN sits below its rport: {lun}");
    assert!(line("rport-5:0-1").contains("FCP Initiator"));
    assert!(line("mpathb ").contains("3600a098038303053453f463045727a41"));
}

#[test]
fn exit_codes() {
    let out = lunkit(&["--root", "/nonexistent/lunkit", "list"]);
    assert_eq!(out.status.code(), Some(3), "missing root is not found");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/lunkit/sys"));

    let out = lunkit(&["lsit"]);
    assert_eq!(out.status.code(), Some(2), "usage error");
}
