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

#[test]
fn doctor_fix_refuses_an_unknown_kind_before_reading_the_node() {
    // The root does not exist: a kind checked first is a usage error (2), not "not found".
    let root = ["--root", "/nonexistent/lunkit"];
    let out = lunkit(&[&root[..], &["doctor", "--fix", "idle-session,scsi-down"]].concat());
    assert_eq!(out.status.code(), Some(2), "unknown kind");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"scsi-down\"") && err.contains("map-paths-down"),
        "{err}"
    );
    let out = lunkit(&[&root[..], &["doctor", "--fix", "idle-session"]].concat());
    assert_eq!(
        out.status.code(),
        Some(3),
        "a known kind goes on to read the node"
    );
}

/// A throwaway copy of a fixture tree (scans write into it).
fn scratch(name: &str, tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("lunkit-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    let st = Command::new("cp")
        .arg("-a")
        .arg(fixture(name))
        .arg(&dst)
        .status()
        .unwrap();
    assert!(st.success());
    dst
}

#[test]
fn scan_exit_codes() {
    let dir = scratch("fc", "scan");
    let root = dir.to_str().unwrap();

    let out = lunkit(&["--root", root, "scan", "hctl", "5:0:0:x"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "malformed H:C:T:L is a usage error"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("5:0:0:x"));

    let out = lunkit(&["--root", root, "scan", "hctl", "9:0:0:0"]);
    assert_eq!(out.status.code(), Some(3), "no such host");

    let out = lunkit(&[
        "--root",
        root,
        "scan",
        "fc",
        "--wwpn",
        "0x500a098188a8b1c1",
        "--lun",
        "4",
    ]);
    assert_eq!(out.status.code(), Some(3), "LUN the target does not report");
    let err = String::from_utf8_lossy(&out.stderr);
    // Both ports were scanned, and the message says what each one found.
    assert!(
        err.contains("5:0:0:4 via host5 rport-5:0-0: not reported by the target")
            && err.contains("6:0:0:4 via host6 rport-6:0-0: not reported by the target"),
        "{err}"
    );

    // No /dev node ever appears in a fixture tree: the wait ends at the deadline.
    let out = lunkit(&[
        "--root",
        root,
        "scan",
        "hctl",
        "5:0:0:0",
        "--timeout",
        "0.2",
    ]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    std::fs::create_dir_all(dir.join("dev")).unwrap();
    std::fs::write(dir.join("dev/sdc"), "").unwrap();
    let other_volume = [
        "--root",
        root,
        "scan",
        "hctl",
        "5:0:0:0",
        "--expect-wwid",
        "naa.600a0980383030534530303030303030",
    ];
    // sdc is a path of map dm-0, another volume than the one expected: in use, not rescanned.
    let out = lunkit(&other_volume);
    assert_eq!(out.status.code(), Some(4), "held by another volume's map");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("multipath map dm-0 is stacked on sdc") && err.contains("not rescanned"),
        "{err}"
    );
    // Once no map holds it, the rescanned path's WWID is compared.
    std::fs::remove_file(dir.join("sys/class/block/sdc/holders/dm-0")).unwrap();
    let out = lunkit(&other_volume);
    assert_eq!(out.status.code(), Some(1), "WWID mismatch");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("naa.600a0980383030534530303030303030")
            && err.contains("naa.600a098038303053453f463045727a41"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no device is printed on a mismatch");

    let out = lunkit(&["--root", root, "scan", "hctl", "5:0:0:0", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &doc["devices"][0];
    assert_eq!(d["name"], "sdc");
    assert_eq!(d["hctl"], "5:0:0:0");
    assert_eq!(
        (d["major"].as_u64(), d["minor"].as_u64()),
        (Some(8), Some(32))
    );
    assert_eq!(d["wwid"], "naa.600a098038303053453f463045727a41");
    assert!(d["path"].as_str().unwrap().ends_with("/dev/sdc"));
    assert!(d["elapsed_us"].is_u64());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn watch_prints_kernel_events() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_lunkit"))
        .args(["watch", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let tag = "0b6f2a8e-5d1c-4e3b-8a7f-2c9d1e0f3a4b";
    // The monitor may not be subscribed yet when the first trigger fires: repeat until seen.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let trigger = std::thread::spawn(move || {
        for _ in 0..50 {
            if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            std::fs::write("/sys/class/mem/null/uevent", format!("change {tag}")).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    });
    let found = lines
        .by_ref()
        .take(500)
        .map_while(Result::ok)
        .find_map(|l| {
            let v: Value = serde_json::from_str(&l).ok()?;
            (v["env"]["SYNTH_UUID"] == tag).then_some(v)
        });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    child.kill().unwrap();
    child.wait().unwrap();
    trigger.join().unwrap();
    let v = found.expect("watch printed the synthetic event");
    assert_eq!(v["action"], "change");
    assert_eq!(v["subsystem"], "mem");
    assert!(v["seqnum"].as_u64().unwrap() > 0);
}

/// `attach` names a volume by its address as `detach` does, lists every path's outcome, and exits by how
/// many paths came (the three-HBA FC node: found behind host4, not reported behind host3,
/// host5's port Blocked).
#[test]
fn attach_lists_every_path_and_exits_by_min_paths() {
    let dir = scratch("fc-three-hbas", "attach");
    let root = dir.to_str().unwrap();
    std::fs::create_dir_all(dir.join("dev")).unwrap();
    std::fs::write(dir.join("dev/sdf"), "").unwrap();
    let fc = ["--fc-wwpn", "0x500a098188a8b1c1", "--lun", "3"];

    let mut args = vec!["--root", root, "attach", "--json", "--timeout", "30"];
    args.extend(fc);
    let out = lunkit(&args);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let outcomes: Vec<(&str, &str)> = doc["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["hctl"].as_str().unwrap(), p["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("3:0:0:3", "not-reported"),
            ("4:0:2:3", "found"),
            ("5:0:1:3", "skipped")
        ]
    );
    assert_eq!(doc["paths"][2]["detail"], "port state Blocked");
    assert_eq!(doc["devices"][0]["name"], "sdf");

    args.extend(["--min-paths", "2"]);
    let out = lunkit(&args);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 of 3 path(s) came, 2 wanted"), "{err}");

    // A WWID or a device path says what a volume is, not where to scan for it: `attach`
    // does not take them (issue 55: its usage line no longer offers them either).
    for (what, said) in [
        (
            vec!["--wwid", "3600a098038303053453f463045727a41"],
            "unexpected argument '--wwid'",
        ),
        (vec!["/dev/sdf"], "invalid value '/dev/sdf' for '[H:C:T:L]'"),
    ] {
        let mut args = vec!["--root", root, "attach"];
        args.extend(what);
        let out = lunkit(&args);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(said), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `resize` on the two-session iSCSI node: every path of the map is rescanned (and no other
/// LUN's), a path that is down refuses the whole before anything is written, a size the
/// paths never reach fails at the deadline naming what each reports, and paths that disagree
/// are refused. (Growing a real map is
/// tests/vm_resize.rs.)
#[test]
fn resize_rescans_every_path_and_refuses_a_path_down_first() {
    let dir = scratch("iscsi-multipath", "resize");
    let root = dir.to_str().unwrap();
    let dev = |h: &str| dir.join(format!("sys/class/scsi_device/{h}/device"));
    let rescan = |h: &str| std::fs::read_to_string(dev(h).join("rescan")).unwrap();
    let resize = |extra: &[&str]| {
        let mut args = vec!["--root", root, "resize", "--json"];
        args.extend_from_slice(extra);
        let out = lunkit(&args);
        let doc: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("no JSON ({e}): {out:?}"));
        (out.status.code(), doc)
    };

    // mpatha (dm-0) is sda (6:0:0:0) and sdc (7:0:0:0).
    std::fs::write(dev("7:0:0:0").join("state"), "offline").unwrap();
    let (code, doc) = resize(&["mpatha"]);
    assert_eq!(code, Some(1), "{doc}");
    let err = doc["error"].as_str().unwrap();
    assert!(err.contains("path 7:0:0:0 (sdc) is offline"), "{err}");
    assert_eq!(
        (rescan("6:0:0:0"), rescan("7:0:0:0")),
        (String::new(), String::new())
    );

    std::fs::write(dev("7:0:0:0").join("state"), "running").unwrap();
    let (code, doc) = resize(&["mpatha"]);
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(
        (rescan("6:0:0:0"), rescan("7:0:0:0")),
        ("1".into(), "1".into())
    );
    assert_eq!(rescan("6:0:0:1"), "", "mpathb's path was rescanned");
    let r = &doc["result"];
    assert_eq!(r["changed"], false, "{doc}");
    assert_eq!(r["size"], 16 << 20, "{doc}");
    assert_eq!(r["map"]["by"], "unchanged", "{doc}");
    assert_eq!(r["paths"].as_array().unwrap().len(), 2, "{doc}");

    let (code, doc) = resize(&["mpatha", "--expect-size", "33554432", "--timeout", "0.3"]);
    assert_eq!(code, Some(5), "{doc}");
    let err = doc["error"].as_str().unwrap();
    for p in [
        "6:0:0:0 (sda) 16777216 bytes",
        "7:0:0:0 (sdc) 16777216 bytes",
    ] {
        assert!(err.contains(p), "{err}");
    }

    // The paths disagree after their rescan (one of them not at the volume's size yet):
    // refused, naming both sizes, before the map is touched.
    std::fs::write(dir.join("sys/block/sdc/size"), "65536").unwrap();
    let (code, doc) = resize(&["mpatha"]);
    assert_eq!(code, Some(1), "{doc}");
    let err = doc["error"].as_str().unwrap();
    assert!(
        err.contains("disagree")
            && err.contains("6:0:0:0 (sda) 16777216 bytes")
            && err.contains("7:0:0:0 (sdc) 33554432 bytes"),
        "{err}"
    );

    let (code, doc) = resize(&["sdz"]);
    assert_eq!(code, Some(3), "{doc}");
    let out = lunkit(&["--root", root, "resize", "--wwid", "naa.xyz"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad input to `nvme connect` exits 2 and writes nothing: not to `/dev/nvme-fabrics` (here a
/// regular file in a scratch root, so a write would show), and not anywhere else. A valid
/// connect to that fake device is refused too: it is not a character device.
#[test]
fn nvme_connect_refuses_bad_input_before_writing_anything() {
    let root = std::env::temp_dir().join(format!("lunkit-cli-nvme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::create_dir_all(root.join("sys/class/nvme")).unwrap();
    std::fs::create_dir_all(root.join("etc/nvme")).unwrap();
    let fabrics = root.join("dev/nvme-fabrics");
    std::fs::write(&fabrics, "").unwrap();
    std::fs::write(
        root.join("etc/nvme/hostnqn"),
        "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-b9a761bde3fb\n",
    )
    .unwrap();
    let r = root.to_str().unwrap();
    let nqn = "nqn.2014-08.org.lunkit:lab";
    let connect = |extra: &[&str]| {
        let mut args = vec!["--root", r, "nvme", "connect", "--json"];
        args.extend_from_slice(extra);
        lunkit(&args)
    };
    for (why, args) in [
        (
            "malformed NQN",
            vec!["--traddr", "127.0.0.1", "--nqn", "nqn.x"],
        ),
        (
            "NQN carrying an option",
            vec![
                "--traddr",
                "127.0.0.1",
                "--nqn",
                "nqn.2014-08.org.a,traddr=1.2.3.4",
            ],
        ),
        (
            "address carrying an option",
            vec!["--traddr", "1.2.3.4,nqn=x", "--nqn", nqn],
        ),
        (
            "host name as address",
            vec!["--traddr", "target.example", "--nqn", nqn],
        ),
        (
            "unknown transport",
            vec!["--transport", "udp", "--traddr", "127.0.0.1", "--nqn", nqn],
        ),
        (
            "port 0",
            vec!["--traddr", "127.0.0.1", "--trsvcid", "0", "--nqn", nqn],
        ),
        (
            "port +1",
            vec!["--traddr", "127.0.0.1", "--trsvcid", "+1", "--nqn", nqn],
        ),
        (
            "host id that is no UUID",
            vec!["--traddr", "127.0.0.1", "--nqn", nqn, "--hostid", "1,x=2"],
        ),
        (
            "host NQN carrying an option",
            vec![
                "--traddr",
                "127.0.0.1",
                "--nqn",
                nqn,
                "--hostnqn",
                "nqn.2014-08.org.h=1",
            ],
        ),
        (
            "interface carrying an option",
            vec![
                "--traddr",
                "127.0.0.1",
                "--nqn",
                nqn,
                "--host-iface",
                "eth0,x=1",
            ],
        ),
        (
            "reconnect_delay 0",
            vec![
                "--traddr",
                "127.0.0.1",
                "--nqn",
                nqn,
                "--reconnect-delay",
                "0",
            ],
        ),
    ] {
        let out = connect(&args);
        assert_eq!(out.status.code(), Some(2), "{why}: {out:?}");
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["ok"], false, "{why}");
        assert!(
            doc["error"].as_str().unwrap().starts_with("invalid "),
            "{why}: {doc}"
        );
        assert_eq!(std::fs::read(&fabrics).unwrap(), b"", "{why}: written");
    }
    // A DH-HMAC-CHAP secret comes from a file; a bad one (a character of the key changed:
    // its CRC no longer matches) is refused naming the file and why, never its content.
    let good = "DHHC-1:01:09GFUL+L04EJzFZN2elQGibBeBw1RuITyd7jlFaOZAJwwOLq:";
    let key_file = root.join("host.key");
    std::fs::write(&key_file, format!("{}\n", good.replacen("09GF", "09GG", 1))).unwrap();
    let kf = key_file.to_str().unwrap();
    // Exit 2 naming the file and why, never the key; nothing written.
    let refused_naming_the_file = |out: &std::process::Output| {
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let text = format!("{out:?}");
        assert!(
            text.contains("host.key") && text.contains("CRC-32"),
            "{text}"
        );
        assert!(!text.contains("L04EJzFZN2el"), "the key was shown: {text}");
        assert_eq!(std::fs::read(&fabrics).unwrap(), b"");
    };
    let out = connect(&[
        "--traddr",
        "127.0.0.1",
        "--nqn",
        nqn,
        "--dhchap-secret-file",
        kf,
    ]);
    refused_naming_the_file(&out);
    // The same file refused by an attach, before any connect; and a controller's secret
    // alone, which cannot authenticate both ways, by the argument parser.
    let attach = |extra: &[&str]| {
        let mut args = vec!["--root", r, "attach", "--nvme-nqn", nqn, "--nsid", "1"];
        args.extend_from_slice(&["--portal", "127.0.0.1:4420", "--json"]);
        args.extend_from_slice(extra);
        lunkit(&args)
    };
    let out = attach(&["--dhchap-secret-file", kf]);
    refused_naming_the_file(&out);
    let out = attach(&["--dhchap-ctrl-secret-file", kf]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--dhchap-secret-file"),
        "{out:?}"
    );
    assert_eq!(std::fs::read(&fabrics).unwrap(), b"");
    let missing = root.join("none.key");
    let m = missing.to_str().unwrap();
    let out = connect(&[
        "--traddr",
        "127.0.0.1",
        "--nqn",
        nqn,
        "--dhchap-ctrl-secret-file",
        m,
    ]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(format!("{out:?}").contains("none.key"), "{out:?}");
    // Well-formed, but the "device" is a regular file: refused, still nothing written.
    let out = connect(&["--traddr", "127.0.0.1", "--nqn", nqn]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(std::fs::read(&fabrics).unwrap(), b"");
    // No host NQN anywhere: exit 3, naming the file to write it to.
    std::fs::remove_file(root.join("etc/nvme/hostnqn")).unwrap();
    let out = connect(&["--traddr", "127.0.0.1", "--nqn", nqn]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("etc/nvme/hostnqn"));
    let _ = std::fs::remove_dir_all(&root);
}

/// `lunkit --root <fixture> batch ARGS` fed `input` on stdin, to its end.
fn batch_on(fixture_name: &str, args: &[&str], input: &str) -> std::process::Output {
    use std::io::Write;
    let root = fixture(fixture_name);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lunkit"))
        .args(["--root", root.to_str().unwrap(), "batch"])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `lunkit batch` runs each line as its own command under the batch's `--root`, ends each
/// with its exit line, and goes on after a failing one.
#[test]
fn batch_runs_each_line_and_reports_its_exit_code() {
    let input = "list --json\n\n# a comment\nlist --bogus\nwatch\nbatch\nflush /dev/nonexistent\n\
                 list --root /nonexistent --json\nlist --json\n";
    let out = batch_on("fc", &[], input);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Each command's output, and the exit code its exit line gives.
    let mut runs: Vec<(String, &str)> = Vec::new();
    let mut output = String::new();
    for line in stdout.lines() {
        match line.strip_prefix("lunkit-batch: exit ") {
            Some(code) => runs.push((std::mem::take(&mut output), code)),
            None => output += &format!("{line}\n"),
        }
    }
    assert!(
        output.is_empty(),
        "output after the last exit line: {output}"
    );
    let codes: Vec<&str> = runs.iter().map(|(_, c)| *c).collect();
    // Blank and comment lines run nothing; a usage error, the two commands that cannot run
    // inside, a device that is not there, and a line that would set its own --root each give
    // their own code. (The fixture root is reached through `..`: only a device name with `..`
    // in it is refused, not the root.)
    assert_eq!(
        codes,
        ["0", "2", "2", "2", "3", "2", "0"],
        "{stdout}\n{stderr}"
    );
    // Each listing is the fixture's, read under the batch's --root.
    for i in [0, 6] {
        let doc: Value = serde_json::from_str(&runs[i].0).unwrap();
        assert_eq!(doc["multipath_maps"][0]["name"], "mpathb");
    }
    assert!(
        stderr.contains("cannot be run inside `lunkit batch`"),
        "{stderr}"
    );
    assert!(stderr.contains("/dev/nonexistent"), "{stderr}");
    assert!(stderr.contains("sets --root"), "{stderr}");
}

/// `lunkit batch --at-once` runs every line at once: each line's exit line names the line,
/// each JSON document comes whole, and the batch ends with its own time.
#[test]
fn batch_at_once_names_each_lines_exit_and_keeps_json_documents_whole() {
    let mut input = String::from("# eight listings and a missing device, at once\n\n");
    for _ in 0..8 {
        input += "list --json\n";
    }
    input += "flush /dev/nonexistent\nwatch\n";
    let out = batch_on("fc", &["--at-once"], &input);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut exits: Vec<(u32, u8)> = Vec::new();
    let mut json = String::new();
    let mut all = None;
    let mut walks = None;
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("lunkit-batch: line ") {
            let (n, code) = rest.split_once(" exit ").expect(line);
            exits.push((n.parse().unwrap(), code.parse().unwrap()));
        } else if let Some(us) = line.strip_prefix("lunkit-batch: all in ") {
            all = Some(us.strip_suffix(" us").expect(line).parse::<u64>().unwrap());
        } else if let Some(w) = line.strip_prefix("lunkit-batch: ") {
            walks = Some(w.to_owned());
        } else {
            json += line;
            json += "\n";
        }
    }
    exits.sort();
    let mut want: Vec<(u32, u8)> = (3..=10).map(|n| (n, 0)).collect();
    want.extend([(11, 3), (12, 2)]);
    assert_eq!(exits, want, "{stdout}\n{stderr}");
    assert!(all.is_some(), "no closing line: {stdout}");
    // No detach among the lines: no walk over the processes.
    assert_eq!(
        walks.as_deref(),
        Some("0 walks over the processes"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with(" us"), "{stdout}");
    // Eight documents, each whole: they parse one after another.
    let docs: Vec<Value> = serde_json::Deserializer::from_str(&json)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(docs.len(), 8);
    assert!(
        docs.iter()
            .all(|d| d["multipath_maps"][0]["name"] == "mpathb")
    );
    assert!(stderr.contains("/dev/nonexistent"), "{stderr}");
}

/// A map whose path reports another WWID than the map's (a LUN re-mapped under the map) is
/// shown as such, in the JSON and in the tree.
#[test]
fn list_shows_a_path_that_reports_another_wwid_than_its_map() {
    let tmp = std::env::temp_dir().join(format!("lunkit-cli-foreign-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let cp = Command::new("cp")
        .arg("-a")
        .arg(fixture("iscsi-multipath"))
        .arg(&tmp)
        .status()
        .unwrap();
    assert!(cp.success());
    std::fs::write(
        tmp.join("sys/devices/platform/host7/session2/target7:0:0/7:0:0:0/wwid"),
        "naa.60014055e7a1000000000000000000ff\n",
    )
    .unwrap();
    let root = tmp.to_str().unwrap();
    let out = lunkit(&["--root", root, "list", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let maps = doc["multipath_maps"].as_array().unwrap();
    let mpatha = maps.iter().find(|m| m["name"] == "mpatha").unwrap();
    assert_eq!(
        mpatha["foreign_paths"],
        serde_json::json!([{"path": "sdc", "wwid": "360014055e7a1000000000000000000ff"}])
    );
    let mpathb = maps.iter().find(|m| m["name"] == "mpathb").unwrap();
    assert_eq!(mpathb["foreign_paths"], serde_json::json!([]));

    let out = lunkit(&["--root", root, "list"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let odd: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("not the map's"))
        .collect();
    assert_eq!(odd.len(), 1, "{text}");
    assert!(
        odd[0].contains("sdc") && odd[0].contains("360014055e7a1000000000000000000ff"),
        "{text}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// `delete --json` of an address with no device: success, said in one line of JSON, and
/// nothing written to the (read-only) fixture tree.
#[test]
fn delete_json_of_an_absent_address_says_already_gone() {
    let root = fixture("fc");
    let out = lunkit(&[
        "--root",
        root.to_str().unwrap(),
        "delete",
        "9:0:0:9",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["hctl"], "9:0:0:9");
    assert_eq!(doc["outcome"], "already-gone");
    assert!(doc["elapsed_us"].is_u64(), "{doc}");
}
