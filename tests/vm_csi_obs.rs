//! VM tests of the CSI node plugin's observability (issue 37, item 5): Probe checks what the
//! node needs (iscsid here, a real one stopped and started again), and the metrics endpoint
//! and the JSON log show a real stage and unstage of an LIO LUN with lunkit's steps. The
//! background doctor counts and logs once lunkit's findings and the plugin's own (issue 36:
//! a stage record whose volume is gone, a published path whose device is gone).
//!
//! Run by `cargo xtask test` inside the QEMU guest (ignored on the host); the plugin binary
//! comes from `LUNKIT_CSI_BIN`.

// The tests start the plugin and iscsid with the fixtures' tools.
#![allow(clippy::disallowed_methods)]

use lunkit_lab as support;

mod csi_plugin;

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use csi_plugin::{Plugin, Ready};
use lunkit_csi::proto::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use lunkit_csi::proto::*;
use lunkit_csi::{Client, Code};
use support::iscsi;
use support::lio::{LioConfig, LioTarget};
use support::multipath::{self, Multipathd};
use support::nvmet::{PortConfig, Target};
use support::{cmd, require_vm, wait};

const BASE: &str = "/tmp/lunkit-csi-obs";
const IQN: &str = "iqn.2003-01.org.linux-iscsi.lunkit:csi-obs";
const PORTAL: &str = "127.0.0.1:3260";
/// Where the plugin serves its metrics in the guest.
const METRICS: &str = "127.0.0.1:9808";

/// iscsid's control socket as `/proc/net/unix` shows it (`@` for the abstract namespace).
const ISCSID_SOCKET: &str = "@ISCSIADM_ABSTRACT_NAMESPACE";

/// iscsid and the plugin (started with `args` besides its socket and state directory);
/// dropping it stops the plugin and what the lab started.
struct Lab {
    plugin: Option<Plugin>,
    started_iscsid: bool,
    target: Option<LioTarget>,
}

impl Lab {
    fn build(args: &[&str]) -> Lab {
        Lab::build_with(None, args)
    }

    /// [`Lab::build`] with an LIO target of one 32 MiB LUN at [`IQN`] on [`PORTAL`].
    fn build_with_target(args: &[&str]) -> Lab {
        let target = LioTarget::create(LioConfig {
            iqn: IQN.into(),
            luns: 1,
            lun_size: 32 << 20,
            portals: vec![PORTAL.into()],
        })
        .expect("the LIO target");
        Lab::build_with(Some(target), args)
    }

    fn build_with(target: Option<LioTarget>, args: &[&str]) -> Lab {
        let _ = fs::remove_dir_all(BASE);
        fs::create_dir_all(BASE).unwrap();
        let mut lab = Lab {
            plugin: None,
            started_iscsid: false,
            target,
        };
        lab.started_iscsid = iscsi::ensure_iscsid().expect("iscsid");
        let limit = Duration::from_secs(60);
        lab.plugin = Some(Plugin::start(
            Plugin::binary(),
            BASE,
            args,
            Ready::Answers,
            limit,
        ));
        lab
    }

    /// Stops the plugin (SIGTERM) and returns what it wrote on standard error.
    fn stop_plugin(&mut self) -> String {
        let done = self.plugin.take().expect("the plugin runs").stop("TERM");
        assert!(
            !done.overran && done.code() == Some(0),
            "{}",
            done.describe()
        );
        done.stderr
    }

    fn client(&self) -> Client {
        self.plugin.as_ref().expect("the plugin runs").client()
    }

    /// Probe's answer: `Ok` when ready, else its code and message.
    fn probe(&self) -> Result<(), (Code, String)> {
        match self.client().probe(ProbeRequest {}) {
            Ok(r) => {
                assert_eq!(r.ready, Some(BoolValue { value: true }), "{r:?}");
                Ok(())
            }
            Err(s) => Err((s.code(), s.message().to_owned())),
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        drop(self.plugin.take());
        iscsi::logout_all();
        if self.started_iscsid {
            let _ = iscsi::stop_iscsid();
        }
        if let Some(t) = self.target.take() {
            let _ = t.teardown();
        }
        let _ = fs::remove_dir_all(BASE);
    }
}

/// Whether something listens on iscsid's abstract socket, as the kernel lists it.
fn iscsid_listening() -> bool {
    fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().last() == Some(ISCSID_SOCKET))
}

#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn probe_fails_naming_iscsid_while_it_is_stopped() {
    require_vm();
    let lab = Lab::build(&["--transports", "iscsi"]);
    assert!(iscsid_listening(), "iscsid runs");
    assert_eq!(lab.probe(), Ok(()));

    iscsi::stop_iscsid().expect("stop iscsid");
    assert!(!iscsid_listening(), "iscsid's socket is gone with it");
    let (code, message) = lab
        .probe()
        .expect_err("probe answered ready without iscsid");
    assert_eq!(code, Code::FailedPrecondition, "{message}");
    assert!(message.contains("iscsid"), "{message}");
    assert!(message.contains(ISCSID_SOCKET), "{message}");
    // The other checks pass: only iscsid is named.
    assert!(!message.contains("state directory"), "{message}");

    // Started again; the lab stops it at the end only if it started it at first.
    iscsi::ensure_iscsid().expect("start iscsid");
    wait::until_true(
        "iscsid to listen on its socket",
        Duration::from_secs(30),
        iscsid_listening,
    )
    .expect("iscsid listens");
    assert_eq!(lab.probe(), Ok(()));
}

/// multipathd stopped with SIGSTOP until dropped (SIGCONT), so that a stage waits for
/// its map for as long as the test needs.
struct Paused;

impl Paused {
    fn multipathd() -> Paused {
        cmd::run("pkill", &["-STOP", "-x", "multipathd"]).expect("stop multipathd");
        Paused
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        cmd::run_ignoring_failure("pkill", &["-CONT", "-x", "multipathd"]);
    }
}

/// The plugin's metrics, scraped as Prometheus does: `GET /metrics` over HTTP.
fn scrape() -> String {
    let mut c = TcpStream::connect(METRICS).expect("connect to the metrics address");
    write!(c, "GET /metrics HTTP/1.1\r\nHost: {METRICS}\r\n\r\n").unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// The value of `series` (name and labels exactly as exposed) in `body`.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().expect("a number"))
}

fn calls(body: &str, method: &str, code: &str) -> Option<f64> {
    sample(
        body,
        &format!("lunkit_csi_rpc_duration_seconds_count{{method=\"{method}\",code=\"{code}\"}}"),
    )
}

fn steps(body: &str, operation: &str, step: &str, outcome: &str) -> Option<f64> {
    sample(
        body,
        &format!(
            "lunkit_csi_step_duration_seconds_count{{operation=\"{operation}\",step=\"{step}\",outcome=\"{outcome}\"}}"
        ),
    )
}

/// Metrics scraped during a stage (held on multipathd's map: the call in flight, lunkit's
/// attach steps, no finished stage), after it (the call by code, a refused call among the
/// errors, the staged gauge) and after the unstage (the detach's steps); the JSON log of the
/// same run has every call and step with its duration.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn metrics_and_the_log_show_a_stage_and_an_unstage_with_lunkits_steps() {
    require_vm();
    let mut lab = Lab::build_with_target(&["--metrics-address", METRICS, "--log-format", "json"]);
    let before = scrape();
    assert_eq!(
        sample(&before, "lunkit_csi_volumes_staged"),
        Some(0.0),
        "{before}"
    );
    assert_eq!(calls(&before, "NodeStageVolume", "OK"), None, "{before}");

    let staging = format!("{BASE}/staging/pv-obs");
    fs::create_dir_all(&staging).unwrap();
    let stage = NodeStageVolumeRequest {
        volume_id: "pv-obs".into(),
        staging_target_path: staging.clone(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }),
        volume_context: HashMap::from([
            ("targetPortal".to_owned(), PORTAL.to_owned()),
            ("iqn".to_owned(), IQN.to_owned()),
            ("lun".to_owned(), "0".to_owned()),
        ]),
        ..Default::default()
    };
    let mut c = lab.client();
    // During the stage: multipathd is stopped (SIGSTOP), so the stage waits for its map
    // after lunkit's scan has returned. A scrape then shows the call in flight and the
    // attach's steps, and no finished stage.
    let multipathd = Multipathd::start(multipath::DEFAULT_CONF).expect("multipathd");
    let paused = Paused::multipathd();
    let staging_call = std::thread::spawn(move || {
        Client::connect(&Plugin::socket(BASE))
            .expect("connect to the plugin")
            .node_stage_volume(stage)
    });
    let during = wait::until(
        "a scrape showing the stage in flight past lunkit's attach",
        Duration::from_secs(300),
        || {
            let body = scrape();
            let waiting = sample(
                &body,
                "lunkit_csi_rpc_in_flight{method=\"NodeStageVolume\"}",
            ) == Some(1.0)
                && steps(&body, "attach", "attach", "done") == Some(1.0);
            Ok(waiting.then_some(body))
        },
    )
    .expect("the stage in flight");
    assert_eq!(
        steps(&during, "attach", "scan", "done"),
        Some(1.0),
        "{during}"
    );
    assert_eq!(calls(&during, "NodeStageVolume", "OK"), None, "{during}");
    drop(paused);
    staging_call
        .join()
        .expect("the staging thread")
        .expect("stage");
    // A refused call: counted by its code, among the errors.
    let refused = c
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: "pv-obs-2".into(),
            ..Default::default()
        })
        .expect_err("a stage without a staging path");
    assert_eq!(refused.code(), Code::InvalidArgument);

    let staged = scrape();
    assert_eq!(
        calls(&staged, "NodeStageVolume", "OK"),
        Some(1.0),
        "{staged}"
    );
    assert_eq!(
        sample(
            &staged,
            "lunkit_csi_rpc_errors_total{method=\"NodeStageVolume\",code=\"InvalidArgument\"}"
        ),
        Some(1.0),
        "{staged}"
    );
    assert_eq!(
        sample(&staged, "lunkit_csi_volumes_staged"),
        Some(1.0),
        "{staged}"
    );
    assert_eq!(
        sample(
            &staged,
            "lunkit_csi_rpc_in_flight{method=\"NodeStageVolume\"}"
        ),
        Some(0.0),
        "{staged}"
    );
    // lunkit's attach: the scan of the LUN on its one path, and the whole attach.
    assert_eq!(
        steps(&staged, "attach", "scan", "done"),
        Some(1.0),
        "{staged}"
    );
    assert_eq!(
        steps(&staged, "attach", "attach", "done"),
        Some(1.0),
        "{staged}"
    );
    assert_eq!(steps(&staged, "detach", "detach", "done"), None, "{staged}");

    c.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: "pv-obs".into(),
        staging_target_path: staging,
    })
    .expect("unstage");
    let unstaged = scrape();
    assert_eq!(
        calls(&unstaged, "NodeUnstageVolume", "OK"),
        Some(1.0),
        "{unstaged}"
    );
    assert_eq!(
        sample(&unstaged, "lunkit_csi_volumes_staged"),
        Some(0.0),
        "{unstaged}"
    );
    // lunkit's detach, step by step as its report names them: the one path deleted.
    assert_eq!(
        steps(&unstaged, "detach", "delete-path", "done"),
        Some(1.0),
        "{unstaged}"
    );
    assert_eq!(
        steps(&unstaged, "detach", "detach", "done"),
        Some(1.0),
        "{unstaged}"
    );
    let sessions: Vec<_> = iscsi::sessions()
        .into_iter()
        .filter(|s| s.target == IQN)
        .collect();
    assert!(sessions.is_empty(), "sessions left: {sessions:?}");

    multipathd.stop().expect("stop multipathd");

    // The log: one JSON object a line; one per call with its volume, code and duration, and
    // one per lunkit step with its duration, inside its call's span.
    let log = lab.stop_plugin();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let call = |method: &str| {
        lines
            .iter()
            .filter(|l| l["msg"] == "call" && l["method"] == method)
            .collect::<Vec<_>>()
    };
    for method in ["NodeStageVolume", "NodeUnstageVolume"] {
        let c = call(method);
        assert_eq!(c.len(), 1, "{method}: {log}");
        assert_eq!(c[0]["volume_id"], "pv-obs", "{log}");
        assert_eq!(c[0]["code"], "OK", "{log}");
        assert!(
            c[0]["duration_seconds"].as_f64().is_some_and(|d| d > 0.0),
            "{log}"
        );
    }
    let step = |operation: &str, name: &str| {
        lines.iter().find(|l| {
            l["msg"] == "step"
                && l["volume_id"] == "pv-obs"
                && l["operation"] == operation
                && l["step"] == name
        })
    };
    // Each step is an event in its call's span, whose method it carries.
    let scan = step("attach", "scan").unwrap_or_else(|| panic!("no scan step: {log}"));
    assert!(scan["duration_seconds"].as_f64().is_some(), "{scan}");
    assert_eq!(scan["method"], "NodeStageVolume", "{scan}");
    let delete = step("detach", "delete-path").unwrap_or_else(|| panic!("no delete step: {log}"));
    assert_eq!(delete["outcome"], "done", "{delete}");
    assert_eq!(delete["method"], "NodeUnstageVolume", "{delete}");
    assert!(delete["duration_seconds"].as_f64().is_some(), "{delete}");
}

/// The plugin's background doctor (`--doctor-interval`): an NVMe controller whose port went
/// away shows in `lunkit_csi_doctor_findings{kind="nvme-controller-down"}` and is logged once
/// however many examinations see it; gone, the count is 0 again. The plugin never touches it.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn the_background_doctor_counts_a_controller_that_is_not_live_and_logs_it_once() {
    require_vm();
    let mut lab = Lab::build(&[
        "--metrics-address",
        METRICS,
        "--log-format",
        "json",
        "--doctor-interval",
        "1",
        "--doctor-grace",
        "2",
    ]);
    const KIND: &str = "lunkit_csi_doctor_findings{kind=\"nvme-controller-down\"}";
    const OK: &str = "lunkit_csi_doctor_examinations_total{result=\"ok\"}";
    let mut t = Target::builder()
        .nqn("nqn.2014-08.org.lunkit:csi-obs-doctor")
        .namespace(16 << 20)
        .port(PortConfig::new(62, "127.0.0.1", "4420"))
        .build()
        .expect("nvmet target");
    let opts = lunkit::nvme::ConnectOptions::new(
        "127.0.0.1".parse().unwrap(),
        4420,
        t.nqn().parse().unwrap(),
    );
    let c = lunkit::nvme::connect(&lunkit::Root::default(), &opts).expect("connect");
    let state = format!("/sys/class/nvme/{}/state", c.controller);
    t.remove_port(62).unwrap();
    // The host notices the lost link on its own (keep-alive, I/O errors).
    wait::until_true(
        "the controller to leave live",
        Duration::from_secs(60),
        || fs::read_to_string(&state).map_or(true, |s| s.trim() != "live"),
    )
    .expect("the controller not live");
    let found = wait::until(
        "the finding on the metrics",
        Duration::from_secs(60),
        || {
            let body = scrape();
            Ok((sample(&body, KIND) == Some(1.0)).then(|| sample(&body, OK).unwrap_or(0.0)))
        },
    )
    .expect("the finding counted");
    // Two examinations more, which see the same controller.
    wait::until_true("two more examinations", Duration::from_secs(60), || {
        sample(&scrape(), OK).is_some_and(|n| n >= found + 2.0)
    })
    .expect("the doctor examines again");
    assert!(
        fs::metadata(&state).is_ok(),
        "the plugin's doctor took the controller away"
    );
    fs::write(
        format!("/sys/class/nvme/{}/delete_controller", c.controller),
        "1",
    )
    .unwrap();
    wait::until_true("the count back to 0", Duration::from_secs(60), || {
        sample(&scrape(), KIND) == Some(0.0)
    })
    .expect("the finding gone");
    t.teardown().unwrap();

    let log = lab.stop_plugin();
    let logged: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["msg"] == "doctor finding" && l["kind"] == "nvme-controller-down")
        .collect();
    assert_eq!(logged.len(), 1, "logged once: {log}");
    assert_eq!(logged[0]["objects"], c.controller.as_str(), "{log}");
    // Counted only once it had lasted the grace: the why says for how long it was seen.
    let why = logged[0]["why"].as_str().unwrap_or_default();
    let seen: u64 = why
        .split("seen for ")
        .nth(1)
        .and_then(|w| w.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no time seen in {why:?}"));
    assert!(seen >= 2, "counted before its grace passed: {why}");
}

/// The plugin's own doctor kinds: a raw-block volume staged and published, whose SCSI
/// device is then deleted behind the plugin's back (through sysfs, as a LUN unmapped on
/// the array and the path cleaned up by someone else), shows as one `stale-stage-record`
/// (no path or map with the record's WWID) and one `published-path-gone` (the target's bind
/// mount holds a deleted device node), each logged once however many examinations see it;
/// the plugin takes nothing away, and after the unpublish and unstage both counts are 0.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn the_background_doctor_counts_a_stage_record_and_a_publish_whose_device_went_away() {
    device_went_away(true);
}

/// [`the_background_doctor_counts_a_stage_record_and_a_publish_whose_device_went_away`]
/// for an ext4 volume: the publish is a bind mount of the staging mount, whose device number
/// is no longer a block device of the node once the SCSI device is deleted.
#[test]
#[ignore = "VM test: run by cargo xtask test"]
fn the_background_doctor_counts_a_filesystem_publish_whose_device_went_away() {
    device_went_away(false);
}

fn device_went_away(block: bool) {
    use std::os::unix::fs::MetadataExt;
    require_vm();
    let mut lab = Lab::build_with_target(&[
        "--metrics-address",
        METRICS,
        "--log-format",
        "json",
        "--doctor-interval",
        "1",
    ]);
    const STALE: &str = "lunkit_csi_doctor_findings{kind=\"stale-stage-record\"}";
    const GONE: &str = "lunkit_csi_doctor_findings{kind=\"published-path-gone\"}";
    const OK: &str = "lunkit_csi_doctor_examinations_total{result=\"ok\"}";
    let id = if block { "pv-gone" } else { "pv-gone-fs" };
    let staging = format!("{BASE}/staging/{id}");
    let target = format!("{BASE}/publish/{id}/pod-1");
    fs::create_dir_all(&staging).unwrap();
    let access_type = if block {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })
    };
    let capability = Some(VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    });
    let mut c = lab.client();
    c.node_stage_volume(NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.clone(),
        volume_capability: capability.clone(),
        volume_context: HashMap::from([
            ("targetPortal".to_owned(), PORTAL.to_owned()),
            ("iqn".to_owned(), IQN.to_owned()),
            ("lun".to_owned(), "0".to_owned()),
        ]),
        ..Default::default()
    })
    .expect("stage");
    c.node_publish_volume(NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.clone(),
        target_path: target.clone(),
        volume_capability: capability,
        ..Default::default()
    })
    .expect("publish");

    // Staged and published with its device there: two examinations find neither kind.
    let start = wait::until("a first examination", Duration::from_secs(60), || {
        Ok(sample(&scrape(), OK).filter(|n| *n >= 1.0))
    })
    .expect("the doctor examines");
    wait::until_true("two more examinations", Duration::from_secs(60), || {
        sample(&scrape(), OK).is_some_and(|n| n >= start + 2.0)
    })
    .expect("the doctor examines again");
    let before = scrape();
    for kind in [STALE, GONE] {
        assert!(
            sample(&before, kind).is_none_or(|n| n == 0.0),
            "{kind} with the device there: {before}"
        );
    }

    // The volume's device, deleted behind the plugin's back (no multipathd runs: the
    // volume is its one path): the node the target binds, or the one the filesystem is on.
    let published = fs::metadata(&target).expect("the published path");
    let dev = if block {
        published.rdev()
    } else {
        published.dev()
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sysfs = format!("/sys/dev/block/{major}:{minor}");
    let disk = fs::canonicalize(&sysfs).expect("the published device in sysfs");
    fs::write(format!("{sysfs}/device/delete"), "1").expect("delete the SCSI device");
    wait::until_true("the device to leave sysfs", Duration::from_secs(60), || {
        !disk.exists()
    })
    .expect("the device gone");

    let found = wait::until("both kinds on the metrics", Duration::from_secs(60), || {
        let body = scrape();
        Ok(
            (sample(&body, STALE) == Some(1.0) && sample(&body, GONE) == Some(1.0))
                .then(|| sample(&body, OK).unwrap_or(0.0)),
        )
    })
    .expect("both findings counted");
    wait::until_true("two more examinations", Duration::from_secs(60), || {
        sample(&scrape(), OK).is_some_and(|n| n >= found + 2.0)
    })
    .expect("the doctor examines again");
    let still = scrape();
    assert_eq!(sample(&still, STALE), Some(1.0), "{still}");
    assert_eq!(sample(&still, GONE), Some(1.0), "{still}");
    // Read only: the record and the publish are as they were.
    let records = fs::read_dir(format!("{BASE}/state/volumes"))
        .expect("the state directory")
        .count();
    assert_eq!(records, 1, "the plugin's doctor removed the record");
    let still = fs::metadata(&target).expect("still published");
    assert_eq!(
        if block { still.rdev() } else { still.dev() },
        dev,
        "the plugin's doctor unmounted the target"
    );

    // The operator's (kubelet's) way out: unpublish and unstage, which find nothing to take.
    c.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.clone(),
    })
    .expect("unpublish");
    c.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging,
    })
    .expect("unstage");
    wait::until_true("both counts back to 0", Duration::from_secs(60), || {
        let body = scrape();
        sample(&body, STALE) == Some(0.0) && sample(&body, GONE) == Some(0.0)
    })
    .expect("the findings gone");
    let sessions: Vec<_> = iscsi::sessions()
        .into_iter()
        .filter(|s| s.target == IQN)
        .collect();
    assert!(sessions.is_empty(), "sessions left: {sessions:?}");

    let log = lab.stop_plugin();
    let logged = |kind: &str| -> Vec<serde_json::Value> {
        log.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["msg"] == "doctor finding" && l["kind"] == kind)
            .collect()
    };
    let stale = logged("stale-stage-record");
    assert_eq!(stale.len(), 1, "logged once: {log}");
    assert_eq!(
        stale[0]["objects"],
        format!("{id},{BASE}/staging/{id}").as_str(),
        "{log}"
    );
    let why = stale[0]["why"].as_str().unwrap_or_default();
    assert!(why.contains("NodeUnstageVolume"), "{why}");
    let gone = logged("published-path-gone");
    assert_eq!(gone.len(), 1, "logged once: {log}");
    assert_eq!(
        gone[0]["objects"],
        format!("{id},{target}").as_str(),
        "{log}"
    );
    let why = gone[0]["why"].as_str().unwrap_or_default();
    let because = if block {
        "was deleted"
    } else {
        "is no longer on the node"
    };
    assert!(why.contains(because), "{why}");
}
