//! Session CHAP through the plugin binary, with a stand-in `iscsiadm` first on its `PATH`: the
//! stand-in logs every call, keeps node records where `--iscsi-nodes` says, and refuses every
//! login as a target refuses bad credentials (exit 24, `ISCSI_ERR_LOGIN_AUTH_FAILED`),
//! printing its whole command line to standard error. No password may be on any command line
//! (the plugin writes it into the node record, mode 0600, which the stand-in copies at
//! login); the answer must be PERMISSION_DENIED naming the volume and the portal, with the
//! password nowhere else: not in the status, not in the plugin's log, not on disk after; and
//! nothing may be left: the node record deleted, no stage record. (The real login against a
//! CHAP-protected LIO target is `tests/vm_csi.rs`.)

// The test starts the plugin binary; the plugin itself runs programs only through exec.rs.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lunkit_csi::proto::volume_capability::{
    AccessMode, AccessType, BlockVolume, access_mode::Mode,
};
use lunkit_csi::proto::*;
use lunkit_csi::{Client, Code};

const PASSWORD: &str = "n0t-in-any-l0g";
const MUTUAL: &str = "m1tual-s3cret";
const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:chap";

const FAKE_ISCSIADM: &str = r#"#!/bin/sh
echo "$*" >> "$FAKE_ISCSIADM_LOG"
# The node record of -T IQN -p ADDR:PORT, where open-iscsi keeps it (tpgt -1, as -o new).
T=; P=
while [ $# -gt 0 ]; do
  case "$1" in
    -T) T="$2"; shift ;;
    -p) P="$2"; shift ;;
  esac
  shift
done
REC="$FAKE_ISCSIADM_NODES/$T/$(echo "$P" | tr : ,),-1"
case " $(tail -n 1 "$FAKE_ISCSIADM_LOG") " in
  *" -o new "*)
    mkdir -p "$REC"
    printf '# BEGIN RECORD 2.1.8
node.name = %s
node.session.auth.password = 
# END RECORD
' "$T" > "$REC/default"
    chmod 600 "$REC/default" ;;
  *" -o delete "*)
    rm -rf "$REC" ;;
  *" -o update "*)
    if [ -n "$FAKE_ISCSIADM_FAIL_UPDATE" ]; then
      echo "iscsiadm: cannot update with $(tail -n 1 "$FAKE_ISCSIADM_LOG")" >&2
      exit 7
    fi ;;
  *" --login "*)
    # What iscsiadm would read and hand iscsid: the record, and its mode.
    { stat -c %a "$REC/default"; cat "$REC/default"; } > "$FAKE_ISCSIADM_LOG.login-$P"
    echo "iscsiadm: Could not login with $(tail -n 1 "$FAKE_ISCSIADM_LOG")" >&2
    echo "iscsiadm: initiator reported error (24 - iSCSI login failed due to authorization failure)" >&2
    exit 24 ;;
esac
exit 0
"#;

struct Plugin {
    child: Child,
    dir: tempfile::TempDir,
}

impl Plugin {
    /// The plugin, with a stand-in iscsiadm that refuses logins (and, with `fail_update`,
    /// every `-o update`, echoing its arguments).
    fn start_with(fail_update: bool) -> Plugin {
        Plugin::start_with_args(fail_update, &[])
    }

    /// [`Plugin::start_with`], the plugin given `args` too.
    fn start_with_args(fail_update: bool, args: &[&str]) -> Plugin {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let fake = bin.join("iscsiadm");
        std::fs::write(&fake, FAKE_ISCSIADM).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        // An empty node: no iSCSI session.
        std::fs::create_dir_all(dir.path().join("root/sys/class/iscsi_session")).unwrap();
        // The plugin refuses a root without sys/ and dev/ at start.
        std::fs::create_dir_all(dir.path().join("root/dev")).unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new(env!("CARGO_BIN_EXE_lunkit-csi"))
            .args([
                "--endpoint",
                &format!("unix://{}", sock(dir.path()).display()),
            ])
            .args(["--nodeid", "node-a", "--timeout", "30"])
            .arg("--root")
            .arg(dir.path().join("root"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--iscsi-nodes")
            .arg(dir.path().join("nodes"))
            .args(args)
            .env("PATH", path)
            .env("FAKE_ISCSIADM_NODES", dir.path().join("nodes"))
            .env("FAKE_ISCSIADM_LOG", dir.path().join("iscsiadm.log"))
            .env(
                "FAKE_ISCSIADM_FAIL_UPDATE",
                if fail_update { "1" } else { "" },
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start lunkit-csi");
        Plugin { child, dir }
    }

    fn start() -> Plugin {
        Plugin::start_with(false)
    }

    fn client(&self) -> Client {
        let limit = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = Client::connect(&sock(self.dir.path())) {
                if c.probe(ProbeRequest {}).is_ok() {
                    return c;
                }
            }
            assert!(Instant::now() < limit, "the plugin did not answer in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the plugin and returns what it wrote on standard error.
    fn stop(mut self) -> (String, tempfile::TempDir) {
        let _ = self.child.kill();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        self.child.wait().unwrap();
        (err, self.dir)
    }
}

fn sock(dir: &Path) -> PathBuf {
    dir.join("csi.sock")
}

fn stage_req(dir: &Path, mutual: bool) -> NodeStageVolumeRequest {
    let ctx: HashMap<String, String> = [
        ("targetPortal", "127.0.0.1:3260"),
        ("portals", r#"["127.0.0.2:3260"]"#),
        ("iqn", IQN),
        ("lun", "0"),
        ("sessionCHAPAuth", "true"),
        ("discoveryCHAPAuth", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let mut secrets: HashMap<String, String> = [
        ("node.session.auth.username", "node-a-user"),
        ("node.session.auth.password", PASSWORD),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    if mutual {
        secrets.insert("node.session.auth.username_in".into(), "target-user".into());
        secrets.insert("node.session.auth.password_in".into(), MUTUAL.into());
    }
    NodeStageVolumeRequest {
        volume_id: "pv-chap".into(),
        staging_target_path: dir.join("staging").display().to_string(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }),
        volume_context: ctx,
        secrets,
        ..Default::default()
    }
}

/// Every file under `dir`, read whole.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else if let Ok(b) = std::fs::read(&p) {
            out.push((p, b));
        }
    }
    out
}

#[test]
fn a_refused_chap_login_is_permission_denied_and_leaves_nothing_and_no_password() {
    let p = Plugin::start();
    let mut c = p.client();
    let status = c
        .node_stage_volume(stage_req(p.dir.path(), true))
        .unwrap_err();
    let (log, dir) = p.stop();
    let m = status.message();
    assert_eq!(status.code(), Code::PermissionDenied, "{m}");
    assert!(m.starts_with("volume pv-chap: "), "{m}");
    assert!(
        m.contains("127.0.0.1:3260") && m.contains("127.0.0.2:3260"),
        "both portals named: {m}"
    );
    assert!(m.contains(IQN), "{m}");
    for secret in [PASSWORD, MUTUAL] {
        assert!(!m.contains(secret), "the status carries a password: {m}");
        assert!(
            !log.contains(secret),
            "the plugin's log carries a password: {log}"
        );
    }
    assert!(
        log.contains("NodeStageVolume pv-chap: PermissionDenied"),
        "{log}"
    );

    // What iscsiadm was asked, per portal: a record, its settings in one call, the login,
    // and the record deleted after the refusal.
    let calls = std::fs::read_to_string(dir.path().join("iscsiadm.log")).unwrap();
    for portal in ["127.0.0.1:3260", "127.0.0.2:3260"] {
        // Every node call names the volume's iface: another iface's record is not its own.
        let base = format!("-m node -T {IQN} -p {portal} -I default");
        let ops: Vec<&str> = calls
            .lines()
            .filter_map(|l| l.strip_prefix(&base))
            .map(str::trim)
            .collect();
        assert_eq!(ops.len(), 4, "{portal}: {calls}");
        assert_eq!(ops[0], "-o new");
        // No password on any command line: /proc/PID/cmdline is world-readable.
        assert_eq!(
            ops[1],
            "-o update -n node.session.scan -v manual -n node.startup -v manual \
             -n node.session.auth.authmethod -v CHAP \
             -n node.session.auth.username -v node-a-user \
             -n node.session.auth.username_in -v target-user"
        );
        assert_eq!(ops[2], "--login");
        assert_eq!(ops[3], "-o delete", "the record goes after the refusal");
        // The passwords were in the node record iscsiadm read at login, owner-only.
        let at_login =
            std::fs::read_to_string(dir.path().join(format!("iscsiadm.log.login-{portal}")))
                .unwrap();
        let (mode, record) = at_login.split_once('\n').unwrap();
        assert_eq!(mode, "600", "{at_login}");
        assert!(
            record.contains(&format!("node.session.auth.password = {PASSWORD}\n"))
                && record.contains(&format!("node.session.auth.password_in = {MUTUAL}\n"))
                && record.ends_with("# END RECORD\n"),
            "{record}"
        );
        assert_eq!(
            record.matches("node.session.auth.password =").count(),
            1,
            "the empty password line was replaced: {record}"
        );
    }
    for secret in [PASSWORD, MUTUAL] {
        assert!(
            !calls.contains(secret),
            "a password in iscsiadm's argv: {calls}"
        );
    }
    // The refused login's records are gone, and their secrets with them.
    assert_eq!(files_under(&dir.path().join("nodes")), Vec::new());

    // No stage record left, and no password in anything the plugin wrote to its state.
    let state = files_under(&dir.path().join("state"));
    assert!(
        state
            .iter()
            .all(|(p, _)| !p.starts_with(dir.path().join("state/volumes")) || p.is_dir()),
        "stage records left: {:?}",
        state.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    for (path, bytes) in state {
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(PASSWORD) && !text.contains(MUTUAL),
            "{}",
            path.display()
        );
    }
}

#[test]
fn chap_without_its_secrets_is_refused_before_iscsiadm_runs() {
    let p = Plugin::start();
    let mut c = p.client();
    let mut req = stage_req(p.dir.path(), false);
    req.secrets.remove("node.session.auth.password");
    let s = c.node_stage_volume(req).unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
    assert_eq!(
        s.message(),
        "volume pv-chap: secret node.session.auth.password: missing from the request's \
         secrets (sessionCHAPAuth is true)"
    );
    let mut req = stage_req(p.dir.path(), false);
    req.secrets
        .insert("node.session.auth.password".into(), format!("{PASSWORD}\n"));
    let s = c.node_stage_volume(req).unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{}", s.message());
    assert!(!s.message().contains(PASSWORD), "{}", s.message());
    let (log, dir) = p.stop();
    assert!(!log.contains(PASSWORD), "{log}");
    assert!(
        !dir.path().join("iscsiadm.log").exists(),
        "iscsiadm ran for a refused request"
    );
}

#[test]
fn a_failing_iscsiadm_update_is_reported_without_the_password() {
    let p = Plugin::start_with(true);
    let mut c = p.client();
    let status = c
        .node_stage_volume(stage_req(p.dir.path(), true))
        .unwrap_err();
    let (log, dir) = p.stop();
    let m = status.message();
    assert_eq!(status.code(), Code::Internal, "{m}");
    assert!(m.starts_with("volume pv-chap: "), "{m}");
    // iscsiadm echoed its arguments: they are in the message, and no password was among them.
    assert!(m.contains("cannot update with"), "{m}");
    assert!(!m.contains("auth.password"), "{m}");
    for secret in [PASSWORD, MUTUAL] {
        assert!(!m.contains(secret), "{m}");
        assert!(!log.contains(secret), "{log}");
    }
    let calls = std::fs::read_to_string(dir.path().join("iscsiadm.log")).unwrap();
    let ops: Vec<&str> = calls
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("-m node -T {IQN} -p 127.0.0.1:3260 -I default")))
        .map(|l| l.trim().split(" -n ").next().unwrap_or(""))
        .collect();
    assert_eq!(ops, ["-o new", "-o update", "-o delete"], "{calls}");
    assert!(
        !calls.contains("--login"),
        "no login after a failed update: {calls}"
    );
}

/// `--log-format json`: every line the plugin writes is one JSON object, the refused stage's
/// carries its method, volume, code and duration, and no line carries a password.
#[test]
fn the_json_log_has_one_object_a_line_and_no_password() {
    let p = Plugin::start_with_args(false, &["--log-format", "json"]);
    let mut c = p.client();
    let status = c
        .node_stage_volume(stage_req(p.dir.path(), true))
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    let (log, dir) = p.stop();
    for secret in [PASSWORD, MUTUAL] {
        assert!(!log.contains(secret), "the log carries a password: {log}");
    }
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines.iter().any(
            |l| l["msg"] == "serving on ".to_owned() + &sock(dir.path()).display().to_string()
        ),
        "{log}"
    );
    let calls: Vec<_> = lines.iter().filter(|l| l["msg"] == "call").collect();
    assert_eq!(calls.len(), 1, "{log}");
    let call = calls[0];
    assert_eq!(call["method"], "NodeStageVolume", "{call}");
    assert_eq!(call["volume_id"], "pv-chap", "{call}");
    assert_eq!(call["code"], "PermissionDenied", "{call}");
    assert_eq!(call["level"], "error", "{call}");
    assert_eq!(call["error"], status.message(), "{call}");
    assert!(
        call["duration_seconds"].as_f64().is_some_and(|d| d >= 0.0),
        "{call}"
    );
    assert!(
        call["time"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{call}"
    );
}
