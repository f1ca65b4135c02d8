use super::*;
use crate::attrs;
use std::collections::HashMap;

const OURS: Key = Key(0x1111);
const THEIRS: Key = Key(0x2222);
const WERO: ReservationType = ReservationType::WriteExclusiveRegistrantsOnly;
const WEAR: ReservationType = ReservationType::WriteExclusiveAllRegistrants;

fn held(key: Key, kind: ReservationType) -> Holder {
    Holder {
        key,
        kind: Some(kind),
        type_code: kind.spc_code(),
        scope: 0,
    }
}

#[test]
fn a_single_node_stage_reserves_keeps_preempts_or_refuses() {
    use Preempt::{Always, Never};
    // Nothing held: reserve, whatever the policy.
    assert_eq!(decide(None, OURS, WERO, Always), Step::Reserve);
    assert_eq!(decide(None, OURS, WERO, Never), Step::Reserve);
    // Ours already (a stage again): nothing to do, whatever the policy.
    let ours = held(OURS, WERO);
    assert_eq!(decide(Some(&ours), OURS, WERO, Never), Step::Held);
    assert_eq!(decide(Some(&ours), OURS, WERO, Always), Step::Held);
    // Another node's: preempted and aborted, or refused naming its key in hex.
    let theirs = held(THEIRS, WERO);
    assert_eq!(
        decide(Some(&theirs), OURS, WERO, Always),
        Step::PreemptAbort(THEIRS)
    );
    let Step::Refuse(why) = decide(Some(&theirs), OURS, WERO, Never) else {
        panic!("not refused")
    };
    assert!(why.contains("key 0x0000000000002222"), "{why}");
    assert!(why.contains("fencingPreempt is never"), "{why}");
    // Another node's of any other exclusive type is preempted too.
    let ea = held(THEIRS, ReservationType::ExclusiveAccess);
    assert_eq!(
        decide(Some(&ea), OURS, WERO, Always),
        Step::PreemptAbort(THEIRS)
    );
}

#[test]
fn all_registrants_and_our_own_other_types_are_never_preempted() {
    // A multi-node volume's reservation (key 0: every registrant holds it) is not taken
    // over by a single-node stage, even with `always`.
    let everyone = held(Key(0), WEAR);
    let Step::Refuse(why) = decide(Some(&everyone), OURS, WERO, Preempt::Always) else {
        panic!("preempted an all-registrants reservation")
    };
    assert!(why.contains("every registrant"), "{why}");
    // Our key holding another type than asked: refused, not preempted (never our own).
    let Step::Refuse(why) = decide(Some(&held(OURS, WEAR)), OURS, WERO, Preempt::Always) else {
        panic!("not refused")
    };
    assert!(why.contains("this node's key 0x0000000000001111"), "{why}");
    // An unknown type code is named by its code.
    let odd = Holder {
        key: THEIRS,
        kind: None,
        type_code: 2,
        scope: 0,
    };
    let Step::Refuse(why) = decide(Some(&odd), OURS, WEAR, Preempt::Always) else {
        panic!("not refused")
    };
    assert!(why.contains("type code 2"), "{why}");
}

#[test]
fn a_multi_node_stage_joins_or_reserves_and_never_preempts() {
    assert_eq!(decide(None, OURS, WEAR, Preempt::Always), Step::Reserve);
    // Held by all registrants, which this node is once registered.
    let everyone = held(Key(0), WEAR);
    assert_eq!(
        decide(Some(&everyone), OURS, WEAR, Preempt::Never),
        Step::Held
    );
    assert_eq!(
        decide(Some(&everyone), OURS, WEAR, Preempt::Always),
        Step::Held
    );
    // Another node holding it single-node: refused even with `always`.
    let Step::Refuse(why) = decide(Some(&held(THEIRS, WERO)), OURS, WEAR, Preempt::Always) else {
        panic!("a multi-node stage preempted")
    };
    assert!(why.contains("key 0x0000000000002222"), "{why}");
    assert!(why.contains("never preempts"), "{why}");
}

#[test]
fn unstage_releases_only_what_its_key_holds_alone() {
    assert_eq!(to_release(None, OURS), None);
    assert_eq!(to_release(Some(&held(OURS, WERO)), OURS), Some(WERO));
    // Preempted: another key holds it; never released by us.
    assert_eq!(to_release(Some(&held(THEIRS, WERO)), OURS), None);
    // All registrants: unregistering is enough, a release would end it for every node.
    assert_eq!(to_release(Some(&held(Key(0), WEAR)), OURS), None);
    let odd = Holder {
        key: OURS,
        kind: None,
        type_code: 2,
        scope: 0,
    };
    assert_eq!(to_release(Some(&odd), OURS), None);
}

#[test]
fn the_access_mode_picks_the_reservation_type() {
    for mode in [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
    ] {
        assert!(!multi_node(mode), "{mode:?}");
    }
    for mode in [
        Mode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter,
    ] {
        assert!(multi_node(mode), "{mode:?}");
    }
    let f = |multi_node| Fence {
        key: OURS.to_string(),
        multi_node,
    };
    assert_eq!(f(false).kind(), WERO);
    assert_eq!(f(true).kind(), WEAR);
    assert_eq!(f(false).key().unwrap(), OURS);
}

/// A root with `etc/machine-id`, removed when dropped.
struct TempRoot(std::path::PathBuf);

impl Drop for TempRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_root(machine_id: Option<&str>) -> (TempRoot, Root) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("lunkit-csi-fence-{}-{n}", std::process::id()));
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    if let Some(id) = machine_id {
        std::fs::write(dir.join("etc/machine-id"), id).unwrap();
    }
    let root = Root::new(&dir);
    (TempRoot(dir), root)
}

fn request(attrs: &[(&str, &str)], mode: Mode) -> (Volume, NodeStageVolumeRequest) {
    use crate::proto::VolumeCapability;
    use crate::proto::volume_capability::{AccessMode, AccessType, BlockVolume};
    let ctx: HashMap<String, String> = [
        ("targetPortal", "127.0.0.1:3260"),
        ("iqn", "iqn.2003-01.org.linux-iscsi.lunkit:lab"),
        ("lun", "0"),
    ]
    .into_iter()
    .chain(attrs.iter().copied())
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let vol = attrs::parse("pv-1", &ctx, &HashMap::new()).unwrap();
    let req = NodeStageVolumeRequest {
        volume_id: "pv-1".into(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }),
        ..Default::default()
    };
    (vol, req)
}

#[test]
fn a_stage_asks_for_the_nodes_key_and_the_modes_type() {
    const ID: &str = "4d0c8c7b1a9e4f0e8e2b6f2a1c3d5e7f";
    let (_d, root) = temp_root(Some(ID));
    let (vol, req) = request(&[], Mode::SingleNodeWriter);
    assert_eq!(wanted(&root, &vol, &req).unwrap(), None, "not fenced");
    let (vol, req) = request(
        &[("fencing", "scsi-pr"), ("fencingPreempt", "never")],
        Mode::SingleNodeWriter,
    );
    let (fence, preempt) = wanted(&root, &vol, &req).unwrap().unwrap();
    assert_eq!(fence.key().unwrap(), Key::from_identity(ID));
    assert!(!fence.multi_node);
    assert_eq!(preempt, Preempt::Never);
    let (vol, req) = request(&[("fencing", "scsi-pr")], Mode::MultiNodeMultiWriter);
    let (fence, preempt) = wanted(&root, &vol, &req).unwrap().unwrap();
    assert!(fence.multi_node);
    assert_eq!(preempt, Preempt::Always);
    // The record keeps it, and reads it back.
    let json = serde_json::to_string(&fence).unwrap();
    assert!(json.contains("\"multi-node\":true"), "{json}");
    assert_eq!(serde_json::from_str::<Fence>(&json).unwrap(), fence);
}

#[test]
fn a_node_without_a_machine_id_is_refused_before_anything_is_done() {
    let (_d, root) = temp_root(None);
    let (vol, req) = request(&[("fencing", "scsi-pr")], Mode::SingleNodeWriter);
    let e = wanted(&root, &vol, &req).unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    assert!(e.to_string().contains("machine-id"), "{e}");
}

#[test]
fn a_record_without_a_fence_reads_as_before() {
    let old = r#"{"transport":"iscsi","iqn":"iqn.2003-01.org.linux-iscsi.lunkit:lab","portals":[],"iface":null,"lun":0}"#;
    let t: Target = serde_json::from_str(old).unwrap();
    assert_eq!(t.fence(), None);
    let mut fenced = t.clone();
    fenced.set_fence(Some(Fence {
        key: OURS.to_string(),
        multi_node: false,
    }));
    let json = serde_json::to_string(&fenced).unwrap();
    assert!(
        json.contains("\"fence\":{\"key\":\"0x0000000000001111\""),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<Target>(&json).unwrap(), fenced);
    assert!(!serde_json::to_string(&t).unwrap().contains("fence"));
}
