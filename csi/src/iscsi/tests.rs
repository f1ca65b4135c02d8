use super::discovery::*;
use super::login::*;
use super::*;

const RECORD: &str = "# BEGIN RECORD 2.1.8\nnode.name = iqn.2003-01.org.example:t\n\
node.session.auth.authmethod = CHAP\nnode.session.auth.username = u\n\
node.session.auth.password = old\nnode.startup = manual\n# END RECORD\n";

#[test]
fn secrets_replace_their_lines_before_the_end_of_the_record() {
    let out = with_settings(
        RECORD,
        &[
            ("node.session.auth.password", "n3w secret"),
            ("node.session.auth.password_in", "in"),
        ],
    );
    assert_eq!(
        out,
        "# BEGIN RECORD 2.1.8\nnode.name = iqn.2003-01.org.example:t\n\
node.session.auth.authmethod = CHAP\nnode.session.auth.username = u\n\
node.startup = manual\nnode.session.auth.password = n3w secret\n\
node.session.auth.password_in = in\n# END RECORD\n"
    );
    // Without an end marker, at the end; the username (same prefix) is not touched.
    let out = with_settings(
        "node.session.auth.username = u\n",
        &[("node.session.auth.password", "p")],
    );
    assert_eq!(
        out,
        "node.session.auth.username = u\nnode.session.auth.password = p\n"
    );
}

#[test]
fn sendtargets_listings_give_the_targets_portals_once_each() {
    let listing = "127.0.0.1:3260,1 iqn.2003-01.org.example:t\n\
127.0.0.2:3260,1 iqn.2003-01.org.example:t\n\
127.0.0.1:3260,1 iqn.2003-01.org.example:other\n\
[fd00::1]:3260,2 iqn.2003-01.org.example:t\n\
127.0.0.2:3260,1 iqn.2003-01.org.example:t\n\
iscsiadm: some warning\n";
    assert_eq!(
        portals_of(listing, "iqn.2003-01.org.example:t"),
        ["127.0.0.1:3260", "127.0.0.2:3260", "[fd00::1]:3260"]
    );
    assert!(portals_of(listing, "iqn.2003-01.org.example:none").is_empty());
    assert_eq!(
        discovery_record_path(Path::new("/etc/iscsi/nodes"), "[fd00::1]:3260").unwrap(),
        Path::new("/etc/iscsi/send_targets/fd00::1,3260/st_config")
    );
}

#[test]
fn the_initiator_name_is_read_past_comments() {
    let text =
        "## DO NOT EDIT\n#InitiatorName=iqn.old:x\nInitiatorName=iqn.1993-08.org.debian:01:abc\n";
    assert_eq!(
        initiator_name_in(text).as_deref(),
        Some("iqn.1993-08.org.debian:01:abc")
    );
    assert_eq!(initiator_name_in("# none\nInitiatorName=\n"), None);
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("etc/iscsi")).unwrap();
    std::fs::write(root.path().join("etc/iscsi/initiatorname.iscsi"), text).unwrap();
    let r = Root::new(root.path());
    check_initiator(&r, "pv", "iqn.1993-08.org.debian:01:abc").unwrap();
    let e = check_initiator(&r, "pv", "iqn.2016-04.com.example:other").unwrap_err();
    assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
    assert!(
        e.to_string().contains("iqn.1993-08.org.debian:01:abc"),
        "{e}"
    );
}

#[test]
fn the_record_is_found_by_portal_and_rewritten_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let nodes = tempfile::tempdir().unwrap();
    let iqn = "iqn.2003-01.org.example:t";
    // A record as iscsiadm -o new leaves it (tpgt -1), and one of another portal.
    let dir = nodes.path().join(iqn).join("127.0.0.1,3260,-1");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(nodes.path().join(iqn).join("127.0.0.2,3260,1")).unwrap();
    let rec = dir.join("default");
    std::fs::write(&rec, RECORD).unwrap();
    std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o644)).unwrap();
    write_secrets(
        nodes.path(),
        iqn,
        "127.0.0.1:3260",
        None,
        &[("node.session.auth.password", "s3cret")],
    )
    .unwrap();
    let text = std::fs::read_to_string(&rec).unwrap();
    assert!(
        text.contains("node.session.auth.password = s3cret\n# END RECORD"),
        "{text}"
    );
    assert!(!text.contains("= old"), "{text}");
    let mode = std::fs::metadata(&rec).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
    // A portal with no record is an error naming it; IPv6 portals drop their brackets.
    let e = write_secrets(nodes.path(), iqn, "10.0.0.9:3260", None, &[]).unwrap_err();
    assert!(e.to_string().contains("10.0.0.9:3260"), "{e}");
    let v6 = nodes.path().join(iqn).join("fd00::1,3260,1");
    std::fs::write(&v6, RECORD).unwrap();
    assert_eq!(
        record_path(nodes.path(), iqn, "[fd00::1]:3260", None).unwrap(),
        v6
    );
    // The flat file `-o new` writes without a portal group tag (open-iscsi 2.1.8); a
    // portal whose address only starts the same is not it.
    let flat = nodes.path().join(iqn).join("10.0.0.1,3260");
    std::fs::write(nodes.path().join(iqn).join("10.0.0.10,3260"), RECORD).unwrap();
    std::fs::write(&flat, RECORD).unwrap();
    assert_eq!(
        record_path(nodes.path(), iqn, "10.0.0.1:3260", None).unwrap(),
        flat
    );
}

const IQN: &str = "iqn.2003-01.org.example:t";
const NODE: &str = "iqn.1993-08.org.debian:01:node";
const P0: &str = "10.0.0.1:3260";
const P1: &str = "10.0.0.2:3260";
const P2: &str = "10.0.0.3:3260";

/// A node as sysfs shows it: each session `(sid, host, target, portal, iface, initiator)`
/// under its SCSI host, its class entry and connection 0 linked as the kernel links them,
/// a SCSI device on each of `busy` hosts, and the node's initiator name.
fn node(sessions: &[(u32, u32, &str, &str, &str, &str)], busy: &[u32]) -> tempfile::TempDir {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    for d in [
        "class/iscsi_session",
        "class/iscsi_connection",
        "class/scsi_device",
    ] {
        std::fs::create_dir_all(sys.join(d)).unwrap();
    }
    for &(sid, host, target, portal, iface, initiator) in sessions {
        let dev = format!("devices/platform/host{host}/session{sid}");
        let sess = sys.join(&dev).join(format!("iscsi_session/session{sid}"));
        std::fs::create_dir_all(&sess).unwrap();
        for (name, value) in [
            ("targetname", target),
            ("ifacename", iface),
            ("initiatorname", initiator),
            ("state", "LOGGED_IN"),
        ] {
            std::fs::write(sess.join(name), format!("{value}\n")).unwrap();
        }
        let to = format!("../../{dev}/iscsi_session/session{sid}");
        symlink(to, sys.join(format!("class/iscsi_session/session{sid}"))).unwrap();
        let conn = sys.join(format!(
            "{dev}/connection{sid}:0/iscsi_connection/connection{sid}:0"
        ));
        std::fs::create_dir_all(&conn).unwrap();
        let (addr, port) = portal.rsplit_once(':').unwrap();
        std::fs::write(conn.join("persistent_address"), addr).unwrap();
        std::fs::write(conn.join("persistent_port"), port).unwrap();
        let to = format!("../../{dev}/connection{sid}:0/iscsi_connection/connection{sid}:0");
        symlink(
            to,
            sys.join(format!("class/iscsi_connection/connection{sid}:0")),
        )
        .unwrap();
    }
    for host in busy {
        let d = sys.join(format!("class/scsi_device/{host}:0:0:1/device"));
        std::fs::create_dir_all(d.join("block")).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("etc/iscsi/nodes")).unwrap();
    std::fs::write(
        dir.path().join("etc/iscsi/initiatorname.iscsi"),
        format!("InitiatorName={NODE}\n"),
    )
    .unwrap();
    dir
}

/// An iscsiadm that records each call and its time limit, and answers with `answer`.
type Calls = Vec<(Vec<String>, Duration)>;
fn recorder<'a>(
    calls: &'a mut Calls,
    mut answer: impl FnMut(&[&str]) -> Result<Output> + 'a,
) -> impl FnMut(&[&str], Duration) -> Result<Output> + 'a {
    move |args: &[&str], limit: Duration| {
        calls.push((args.iter().map(|a| a.to_string()).collect(), limit));
        answer(args)
    }
}

fn exited(code: i32) -> Result<Output> {
    Ok(Output {
        code: Some(code),
        stdout: String::new(),
        stderr: String::new(),
    })
}

#[test]
fn a_session_is_the_volumes_only_on_its_iface_under_its_initiator_name() {
    let dir = node(&[], &[]);
    let root = Root::new(dir.path());
    let nodes = dir.path().join("etc/iscsi/nodes");
    let owner = Owner::of(&root, &nodes, None).unwrap();
    assert_eq!(owner.iface, "default");
    assert_eq!(owner.initiator.as_deref(), Some(NODE));
    assert!(owner.owns(Some("default"), Some(&NODE.to_uppercase())));
    assert!(!owner.owns(Some("other"), Some(NODE)));
    assert!(!owner.owns(Some("default"), Some("iqn.2016-04.com.example:else")));
    assert!(!owner.owns(None, Some(NODE)));
    assert!(!owner.owns(Some("default"), None));
    // An iface record with a name of its own: its sessions present that name.
    let ifaces = dir.path().join("etc/iscsi/ifaces");
    std::fs::create_dir_all(&ifaces).unwrap();
    std::fs::write(
        ifaces.join("eth1"),
        "# BEGIN RECORD\niface.iscsi_ifacename = eth1\niface.initiatorname = iqn.x:eth1\n",
    )
    .unwrap();
    std::fs::write(ifaces.join("eth2"), "iface.initiatorname = <empty>\n").unwrap();
    let eth1 = Owner::of(&root, &nodes, Some("eth1")).unwrap();
    assert_eq!(eth1.initiator.as_deref(), Some("iqn.x:eth1"));
    assert!(eth1.owns(Some("eth1"), Some("iqn.x:eth1")) && !eth1.owns(Some("eth1"), Some(NODE)));
    let eth2 = Owner::of(&root, &nodes, Some("eth2")).unwrap();
    assert_eq!(eth2.initiator.as_deref(), Some(NODE));
    // No name anywhere: the iface decides alone.
    let bare = tempfile::tempdir().unwrap();
    let anyone = Owner::of(&Root::new(bare.path()), &nodes, None).unwrap();
    assert!(anyone.owns(Some("default"), None) && !anyone.owns(Some("other"), None));
}

#[test]
fn the_volumes_sessions_are_chosen_by_target_portal_iface_and_initiator_name() {
    let dir = node(
        &[
            (1, 7, IQN, P0, "default", NODE),
            (2, 8, IQN, P0, "other", NODE),
            (3, 9, IQN, P0, "default", "iqn.2016-04.com.example:else"),
            (4, 10, IQN, P1, "default", NODE),
            (5, 11, "iqn.2003-01.org.example:u", P0, "default", NODE),
        ],
        &[],
    );
    let root = Root::new(dir.path());
    let owner = Owner::of(&root, &dir.path().join("etc/iscsi/nodes"), None).unwrap();
    let sids = |portal| -> Vec<u32> {
        let s = sessions_via(&root, IQN, portal, &owner).unwrap();
        s.iter().map(|s| s.sid).collect()
    };
    assert_eq!(sids(P0), [1]);
    assert_eq!(sids(P1), [4]);
    assert!(sids(P2).is_empty());
    let other = Owner {
        iface: "other".into(),
        initiator: Some(NODE.into()),
    };
    let s = sessions_via(&root, IQN, P0, &other).unwrap();
    assert_eq!(s.iter().map(|s| s.sid).collect::<Vec<_>>(), [2]);
}

/// Unstage logs out of the volume's unused sessions by id and deletes only its iface's
/// records; a session on another iface through the same portal, or under another
/// initiator name, is left with its record, whatever devices it has.
#[test]
fn unstage_logs_out_by_session_id_and_deletes_only_its_ifaces_records() {
    let dir = node(
        &[
            (1, 7, IQN, P0, "default", NODE),
            (2, 8, IQN, P0, "other", NODE),
            (3, 9, IQN, P0, "default", "iqn.2016-04.com.example:else"),
            (4, 10, IQN, P1, "default", NODE),
        ],
        &[10],
    );
    let root = Root::new(dir.path());
    let owner = Owner::of(&root, &dir.path().join("etc/iscsi/nodes"), None).unwrap();
    let mut calls = Calls::new();
    let portals = [P0.to_owned(), P1.to_owned(), P2.to_owned()];
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = logout_with(
        &mut recorder(&mut calls, |_| exited(0)),
        &root,
        IQN,
        &owner,
        &portals,
        deadline,
    )
    .unwrap();
    assert_eq!(out, [P0]);
    let args: Vec<String> = calls.iter().map(|(a, _)| a.join(" ")).collect();
    assert_eq!(
        args,
        [
            "-m session -r 1 -u".to_owned(),
            format!("-m node -T {IQN} -p {P0} -I default -o delete"),
            // P1's session has a device: neither logged out nor its record deleted.
            format!("-m node -T {IQN} -p {P2} -I default -o delete"),
        ]
    );
    assert!(calls.iter().skip(1).all(|(_, limit)| *limit == CLEANUP));
}

/// A login that runs out of time still deletes the node record that holds the CHAP
/// secret, with a deadline of its own; a portal with a session of the volume's is not
/// logged in again, and one with only others' sessions is.
#[test]
fn a_login_that_times_out_deletes_its_record_within_a_cleanup_deadline_of_its_own() {
    let dir = node(
        &[
            (2, 8, IQN, P0, "other", NODE),
            (3, 9, IQN, P0, "default", "iqn.2016-04.com.example:else"),
            (4, 10, IQN, P1, "default", NODE),
        ],
        &[],
    );
    let root = Root::new(dir.path());
    let nodes = dir.path().join("etc/iscsi/nodes");
    let owner = Owner::of(&root, &nodes, None).unwrap();
    let record = nodes.join(IQN).join("10.0.0.1,3260");
    let secrets = std::collections::HashMap::from([
        ("node.session.auth.username".to_owned(), "u".to_owned()),
        (
            "node.session.auth.password".to_owned(),
            "s3cret-pa55".to_owned(),
        ),
    ]);
    let chap = crate::attrs::chap("pv", &secrets).unwrap();
    let mut calls = Calls::new();
    let answer = |args: &[&str]| match args.last() {
        Some(&"new") => {
            std::fs::create_dir_all(record.parent().unwrap()).unwrap();
            std::fs::write(&record, "node.name = t\n# END RECORD\n").unwrap();
            exited(0)
        }
        Some(&"--login") => {
            assert!(
                std::fs::read_to_string(&record)
                    .unwrap()
                    .contains("s3cret-pa55")
            );
            // What exec::run says of a program it killed at the deadline.
            Err(Error::Program(
                "iscsiadm ... --login was killed at its deadline".into(),
            ))
        }
        Some(&"delete") => {
            std::fs::remove_file(&record).unwrap();
            exited(0)
        }
        _ => exited(0),
    };
    let target = Node {
        nodes: &nodes,
        iqn: IQN,
        owner: &owner,
    };
    // The call's time is up by the time the login gives up.
    let deadline = Instant::now() + Duration::from_millis(1);
    let done = login_with(
        &mut recorder(&mut calls, answer),
        &root,
        &target,
        &[P0.to_owned(), P1.to_owned()],
        Some(&chap),
        deadline,
    )
    .unwrap();
    assert_eq!(done.existing, [P1]);
    assert!(done.new.is_empty());
    assert_eq!(done.failed.len(), 1, "{:?}", done.failed);
    assert_eq!(done.failed[0].0, P0);
    let (last, limit) = calls.last().unwrap();
    assert_eq!(
        last.join(" "),
        format!("-m node -T {IQN} -p {P0} -I default -o delete")
    );
    assert_eq!(*limit, CLEANUP);
    assert!(!record.exists(), "the record with the secret is gone");
    assert!(
        calls.iter().all(|(a, _)| a.contains(&"-I".to_owned())),
        "every call names the iface: {calls:?}"
    );
    assert!(!calls.iter().any(|(a, _)| a.contains(&P1.to_owned())));
}
