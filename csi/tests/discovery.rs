//! SendTargets discovery (`discovery: "true"`, `discoveryCHAPAuth: "true"`) through the plugin
//! binary, with a stand-in `iscsiadm` first on its `PATH` that logs every call, keeps the
//! discovery record where open-iscsi keeps it (`send_targets/ADDR,PORT/st_config` next to
//! `--iscsi-nodes`), answers a discovery with two portals of the volume's target and one of
//! another target, and refuses every login (exit 24). The discovery password may be on no
//! command line: it must be in the discovery record, mode 0600, when `--discover` reads it,
//! and the record must be gone after. Both portals are logged in to, the other target's
//! never. (The real discovery against an LIO target that enforces discovery CHAP is
//! `tests/vm_csi_peers.rs`.)

// The test starts the plugin binary; the plugin itself runs programs only through exec.rs.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lunkit_csi::proto::volume_capability::{
    AccessMode, AccessType, BlockVolume, access_mode::Mode,
};
use lunkit_csi::proto::*;
use lunkit_csi::{Client, Code};

const PASSWORD: &str = "d1sc-n0t-in-any-l0g";
const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:disc";

const FAKE_ISCSIADM: &str = r#"#!/bin/sh
echo "$*" >> "$FAKE_ISCSIADM_LOG"
M=; P=
for a in "$@"; do
  case "$prev" in
    -m) M="$a" ;;
    -p) P="$a" ;;
  esac
  prev="$a"
done
REC="$FAKE_ISCSIADM_DB/send_targets/$(echo "$P" | tr : ,)"
LINE=" $* "
case "$M:$LINE" in
  discoverydb:*" -o new "*)
    mkdir -p "$REC"
    printf '# BEGIN RECORD 2.1.8\ndiscovery.startup = manual\ndiscovery.type = sendtargets\n# END RECORD\n' > "$REC/st_config" ;;
  discoverydb:*" -o delete "*)
    rm -rf "$REC" ;;
  discoverydb:*" --discover "*)
    # What iscsiadm would read: the record, and its mode.
    { stat -c %a "$REC/st_config"; cat "$REC/st_config"; } > "$FAKE_ISCSIADM_LOG.discover"
    printf '127.0.0.1:3260,1 %s\n127.0.0.2:3260,1 %s\n10.0.0.9:3260,1 iqn.2003-01.org.example:other\n' "$FAKE_IQN" "$FAKE_IQN" ;;
  node:*" --login "*)
    echo "iscsiadm: initiator reported error (24 - iSCSI login failed due to authorization failure)" >&2
    exit 24 ;;
esac
exit 0
"#;

#[test]
fn discovery_chap_goes_through_the_record_never_argv_and_both_portals_are_tried() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("iscsiadm");
    std::fs::write(&fake, FAKE_ISCSIADM).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // An empty node: no iSCSI session.
    std::fs::create_dir_all(dir.path().join("root/sys/class/iscsi_session")).unwrap();
    std::fs::create_dir_all(dir.path().join("root/dev")).unwrap();
    let db = dir.path().join("iscsi");
    let log = dir.path().join("iscsiadm.log");
    let sock = dir.path().join("csi.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lunkit-csi"))
        .arg("--endpoint")
        .arg(format!("unix://{}", sock.display()))
        .args(["--nodeid", "node-a", "--timeout", "30"])
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--iscsi-nodes")
        .arg(db.join("nodes"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("FAKE_ISCSIADM_DB", &db)
        .env("FAKE_ISCSIADM_LOG", &log)
        .env("FAKE_IQN", IQN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lunkit-csi");
    let limit = Instant::now() + Duration::from_secs(30);
    let mut c = loop {
        if let Ok(mut c) = Client::connect(&sock) {
            if c.probe(ProbeRequest {}).is_ok() {
                break c;
            }
        }
        assert!(Instant::now() < limit, "the plugin did not answer in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let attrs: HashMap<String, String> = [
        ("targetPortal", "127.0.0.1:3260"),
        ("portals", "[]"),
        ("iqn", IQN),
        ("lun", "0"),
        ("discovery", "true"),
        ("discoveryCHAPAuth", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let secrets: HashMap<String, String> = [
        ("discovery.sendtargets.auth.username", "disc-user"),
        ("discovery.sendtargets.auth.password", PASSWORD),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let status = c
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: "pv-disc".into(),
            staging_target_path: dir.path().join("staging").display().to_string(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Block(BlockVolume {})),
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
            }),
            volume_context: attrs,
            secrets,
            ..Default::default()
        })
        .unwrap_err();
    let _ = child.kill();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();

    // The logins were refused on both portals: the one named and the one discovered.
    let m = status.message();
    assert_eq!(status.code(), Code::PermissionDenied, "{m}");
    assert!(
        m.contains("127.0.0.1:3260") && m.contains("127.0.0.2:3260"),
        "both portals: {m}"
    );
    assert!(
        !m.contains(PASSWORD) && !err.contains(PASSWORD),
        "{m}\n{err}"
    );

    let calls = std::fs::read_to_string(&log).unwrap();
    assert!(
        !calls.contains(PASSWORD),
        "a password on a command line: {calls}"
    );
    let calls: Vec<&str> = calls.lines().collect();
    let base = "-m discoverydb -t sendtargets -p 127.0.0.1:3260";
    assert_eq!(
        calls[..4],
        [
            format!("{base} -o new"),
            format!(
                "{base} -o update -n discovery.sendtargets.auth.authmethod -v CHAP \
                 -n discovery.sendtargets.auth.username -v disc-user"
            ),
            format!("{base} --discover -o nonpersistent"),
            format!("{base} -o delete"),
        ],
        "{calls:#?}"
    );
    for portal in ["127.0.0.1:3260", "127.0.0.2:3260"] {
        let login = format!("-m node -T {IQN} -p {portal} -I default --login");
        assert!(calls.contains(&login.as_str()), "{login} in {calls:#?}");
    }
    assert!(
        !calls.iter().any(|c| c.contains("10.0.0.9")),
        "another target's portal: {calls:#?}"
    );
    // What --discover read: the secret in the record, readable by root only.
    let seen = std::fs::read_to_string(log.with_extension("log.discover")).unwrap();
    assert!(seen.starts_with("600\n"), "{seen}");
    assert!(
        seen.contains(&format!(
            "discovery.sendtargets.auth.password = {PASSWORD}\n# END RECORD"
        )),
        "{seen}"
    );
    // Nothing left: no discovery record, no stage record.
    assert!(
        !db.join("send_targets/127.0.0.1,3260").exists(),
        "the discovery record is left"
    );
    let records: Vec<_> = std::fs::read_dir(dir.path().join("state/volumes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(records.is_empty(), "stage records left: {records:?}");
}
