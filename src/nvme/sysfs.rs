//! NVMe in sysfs: controllers (`/sys/class/nvme`), subsystems (`/sys/class/nvme-subsystem`)
//! and namespaces (`/sys/block/nvme*n*`).
//!
//! With native multipath (`CONFIG_NVME_MULTIPATH`, on in distribution kernels) a namespace
//! reached through several controllers of one subsystem is one block device, the *head*
//! `nvme<S>n<N>` (`S` the subsystem's instance), over hidden per-controller *paths*
//! `nvme<S>c<C>n<N>` (`C` the controller's instance) that have no device node and sit in
//! their controller's directory with their ANA state. Without it, each controller has its
//! own `nvme<C>n<N>`, a block device of its own.

use crate::error::Result;
use crate::root::Root;
use crate::sysfs::{Confine, attr, attr_parse, entries, sub_entries};

crate::sysfs::kernel_state! {
    /// An NVMe controller's state (`/sys/class/nvme/nvmeX/state`, `nvme_sysfs_show_state`).
    CtrlState {
        /// Created, not yet connected.
        New = "new",
        /// Connected and serving I/O.
        Live = "live",
        /// Being reset.
        Resetting = "resetting",
        /// Lost its link; the kernel reconnects every `reconnect_delay` seconds until
        /// `ctrl_loss_tmo` passes.
        Connecting = "connecting",
        /// Being deleted.
        Deleting = "deleting",
        /// Being deleted, its I/O already failed.
        DeletingNoIo = "deleting (no IO)",
        /// Gave up: removed or failed for good.
        Dead = "dead",
    }
}

impl CtrlState {
    /// Whether the controller is on its way back to `live` by itself (`connecting`,
    /// `resetting`, `new`): a path that is not serving I/O now but will be.
    pub fn is_reconnecting(&self) -> bool {
        matches!(
            self,
            CtrlState::Connecting | CtrlState::Resetting | CtrlState::New
        )
    }

    /// Whether the kernel is taking the controller away (`deleting`, `deleting (no IO)`,
    /// `dead`): such a controller is never handed out as an existing path, and a new connect
    /// of its path is allowed.
    pub fn is_going(&self) -> bool {
        matches!(
            self,
            CtrlState::Deleting | CtrlState::DeletingNoIo | CtrlState::Dead
        )
    }
}

/// One NVMe controller, `/sys/class/nvme/nvmeX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeController {
    /// `nvmeX`.
    pub name: String,
    /// `pcie`, `tcp`, `rdma`, `fc` or `loop`.
    pub transport: Option<String>,
    /// Fabrics address (`traddr=…,trsvcid=…`) or PCI address.
    pub address: Option<String>,
    /// `live`, `connecting`, `resetting`, `deleting`, `dead`..., as the kernel wrote it (what
    /// `lunkit list` shows).
    pub state: Option<String>,
    /// [`state`](Self::state) parsed, for the workflows to decide on.
    pub parsed_state: Option<CtrlState>,
    /// The subsystem NQN.
    pub subsysnqn: Option<String>,
    /// Model string.
    pub model: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// Namespace block devices below the controller (`nvme0n1`, or `nvme0c0n1` paths under
    /// native multipath).
    pub namespaces: Vec<String>,
    /// The controller id the subsystem gave it.
    pub cntlid: Option<u16>,
    /// The host NQN it connected as (fabrics only).
    pub hostnqn: Option<String>,
    /// The host id it connected with (fabrics only).
    pub hostid: Option<String>,
    /// The sysfs object it was read from: a controller deleted and another made under the
    /// same name (the kernel hands out the lowest free instance) is another object.
    pub object: Option<crate::id::ObjectId>,
}

impl NvmeController {
    /// One field of a fabrics controller's `address` (`traddr`, `trsvcid`, `host_iface`,
    /// `src_addr`): the attribute is `key=value` pairs joined by `,`.
    pub fn address_field(&self, key: &str) -> Option<&str> {
        address_field(self.address.as_deref()?, key)
    }
}

/// One field of a fabrics `address` attribute (`traddr=127.0.0.1,trsvcid=4420,src_addr=…`).
pub fn address_field<'a>(address: &'a str, key: &str) -> Option<&'a str> {
    address
        .split(',')
        .filter_map(|f| f.split_once('='))
        .find_map(|(k, v)| (k == key).then_some(v))
}

/// One NVMe subsystem the node knows, `/sys/class/nvme-subsystem/nvme-subsysN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeSubsystem {
    /// `nvme-subsys0`.
    pub name: String,
    /// The subsystem NQN.
    pub nqn: Option<String>,
    /// Model string.
    pub model: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// The native-multipath I/O policy (`numa`, `round-robin`).
    pub iopolicy: Option<String>,
    /// Its controllers on this node (`nvme0`, `nvme1`).
    pub controllers: Vec<String>,
    /// Its namespace block devices (heads under native multipath: `nvme0n1`).
    pub namespaces: Vec<String>,
}

/// A namespace block device: a native-multipath head, or one controller's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeNamespace {
    /// `nvme0n1`.
    pub name: String,
    /// The namespace id.
    pub nsid: Option<u32>,
    /// The kernel's identity for it (`uuid.…`, `eui.…`, `nvme.…`): NGUID, EUI-64 or UUID,
    /// whichever the controller reported, else one made of the vendor id, serial and model.
    pub wwid: Option<String>,
    /// The namespace UUID, when reported.
    pub uuid: Option<String>,
    /// The namespace NGUID, when reported.
    pub nguid: Option<String>,
    /// The namespace EUI-64, when reported.
    pub eui: Option<String>,
    /// Size in bytes.
    pub size_bytes: Option<u64>,
    /// Under native multipath, the hidden paths through each controller.
    pub paths: Vec<NvmePath>,
}

/// One controller's path to a native-multipath head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmePath {
    /// `nvme0c1n1`.
    pub name: String,
    /// The controller it goes through (`nvme1`).
    pub controller: String,
    /// Its ANA state (`optimized`, `non-optimized`, `inaccessible`…).
    pub ana_state: Option<String>,
}

/// The parts of a namespace device name: `nvme<S>n<N>` is `(S, None, N)`,
/// `nvme<S>c<C>n<N>` is `(S, Some(C), N)`.
pub fn parse_namespace_name(name: &str) -> Option<(u32, Option<u32>, u32)> {
    let rest = name.strip_prefix("nvme")?;
    let (ctrl, ns) = rest.split_once('n')?;
    let ns = crate::id::decimal(ns)?;
    match ctrl.split_once('c') {
        Some((s, c)) => Some((crate::id::decimal(s)?, Some(crate::id::decimal(c)?), ns)),
        None => Some((crate::id::decimal(ctrl)?, None, ns)),
    }
}

/// Whether `name` looks like `nvme<X>n<N>` or `nvme<S>c<X>n<N>`.
fn is_namespace(name: &str) -> bool {
    parse_namespace_name(name).is_some()
}

/// Reads every NVMe controller.
pub fn controllers(root: &Root) -> Result<Vec<NvmeController>> {
    let class = root.sys("class/nvme");
    let mut out = Vec::new();
    for name in entries(&class)? {
        if let Some(c) = controller(root, &name)? {
            out.push(c);
        }
    }
    Ok(out)
}

/// Reads controller `name` (`nvme0`); `None` when it does not exist (or its directory leads
/// out of the root).
pub fn controller(root: &Root, name: &str) -> Result<Option<NvmeController>> {
    crate::sysfs::check_component("NVMe controller", name)?;
    let Some(d) = Confine::new(root).dir(&controller_dir(root, name)) else {
        return Ok(None);
    };
    if !d.is_dir() {
        return Ok(None);
    }
    let namespaces = match entries(&d) {
        Ok(e) => e.into_iter().filter(|n| is_namespace(n)).collect(),
        // Deleted since it was listed.
        Err(e) if e.is_gone() => return Ok(None),
        Err(e) => return Err(e),
    };
    let state = attr(&d, "state");
    Ok(Some(NvmeController {
        cntlid: attr_parse(&d, "cntlid"),
        hostnqn: attr(&d, "hostnqn"),
        hostid: attr(&d, "hostid"),
        transport: attr(&d, "transport"),
        address: attr(&d, "address"),
        parsed_state: state.as_deref().map(CtrlState::parse),
        state,
        subsysnqn: attr(&d, "subsysnqn"),
        model: attr(&d, "model"),
        serial: attr(&d, "serial"),
        namespaces,
        name: name.to_owned(),
        object: crate::sysfs::object_id(&d),
    }))
}

/// `<root>/sys/class/nvme/<name>`: the one spelling of a controller's directory, whose
/// `delete_controller` and `rescan_controller` the actions write.
pub(crate) fn controller_dir(root: &Root, name: &str) -> std::path::PathBuf {
    root.sys("class/nvme").join(name)
}

/// Reads every NVMe subsystem.
pub fn subsystems(root: &Root) -> Result<Vec<NvmeSubsystem>> {
    let class = root.sys("class/nvme-subsystem");
    let confine = Confine::new(root);
    let mut out = Vec::new();
    for name in entries(&class)? {
        let Some(d) = confine.dir(&class.join(&name)) else {
            continue;
        };
        let Ok(children) = entries(&d) else {
            continue;
        };
        let (mut controllers, mut namespaces) = (Vec::new(), Vec::new());
        for c in children {
            match parse_namespace_name(&c) {
                Some(_) => namespaces.push(c),
                None if c
                    .strip_prefix("nvme")
                    .and_then(crate::id::decimal::<u32>)
                    .is_some() =>
                {
                    controllers.push(c)
                }
                None => {}
            }
        }
        out.push(NvmeSubsystem {
            nqn: attr(&d, "subsysnqn"),
            model: attr(&d, "model"),
            serial: attr(&d, "serial"),
            iopolicy: attr(&d, "iopolicy"),
            controllers,
            namespaces,
            name,
        });
    }
    Ok(out)
}

/// Reads every namespace block device (`/sys/block/nvme*n*`, not the hidden paths).
pub fn namespaces(root: &Root) -> Result<Vec<NvmeNamespace>> {
    let mut out = Vec::new();
    for name in crate::block::sysfs::names(root)? {
        if !matches!(parse_namespace_name(&name), Some((_, None, _))) {
            continue;
        }
        if let Some(ns) = namespace(root, &name)? {
            out.push(ns);
        }
    }
    Ok(out)
}

/// Reads namespace block device `name` (`nvme0n1`); `None` when it does not exist.
pub fn namespace(root: &Root, name: &str) -> Result<Option<NvmeNamespace>> {
    crate::sysfs::check_component("NVMe namespace", name)?;
    let Some(d) = Confine::new(root).dir(&root.sys("class/block").join(name)) else {
        return Ok(None);
    };
    if !d.is_dir() {
        return Ok(None);
    }
    // A head's paths are named after it (`nvme<S>c<C>n<N>` under `nvme<S>n<N>`) and sit in
    // their controller's directory; newer kernels also link them from the head's
    // `multipath/` directory, which 6.1 does not have.
    let confine = Confine::new(root);
    let mut names = sub_entries(&d, "multipath")?;
    if let Some((s, None, n)) = parse_namespace_name(name) {
        for c in entries(&root.sys("class/nvme"))? {
            let Some(dir) = confine.dir(&controller_dir(root, &c)) else {
                continue;
            };
            for p in entries(&dir)? {
                if matches!(parse_namespace_name(&p), Some((ps, Some(_), pn)) if ps == s && pn == n)
                {
                    names.push(p);
                }
            }
        }
    }
    names.sort_by(|a, b| crate::sysfs::natural_cmp(a, b));
    names.dedup();
    let mut paths = Vec::new();
    for p in names {
        let Some((_, Some(c), _)) = parse_namespace_name(&p) else {
            continue;
        };
        let controller = format!("nvme{c}");
        let dir = confine.dir(&controller_dir(root, &controller).join(&p));
        paths.push(NvmePath {
            ana_state: dir.and_then(|d| attr(&d, "ana_state")),
            controller,
            name: p,
        });
    }
    Ok(Some(NvmeNamespace {
        nsid: attr_parse(&d, "nsid"),
        wwid: attr(&d, "wwid"),
        uuid: attr(&d, "uuid"),
        nguid: attr(&d, "nguid"),
        eui: attr(&d, "eui"),
        size_bytes: attr_parse::<u64>(&d, "size").map(|s| s.saturating_mul(512)),
        paths,
        name: name.to_owned(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    /// A node with one NVMe/TCP subsystem, two controllers and one native-multipath head, laid
    /// out as Debian's 6.1 kernel lays it out (no `multipath/` links on the head).
    fn tree(dir: &Path) {
        let w = |rel: &str, text: &str| {
            let p = dir.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, format!("{text}\n")).unwrap();
        };
        let nqn = "nqn.2014-08.org.lunkit:lab";
        for (c, addr, ana) in [
            (0, "127.0.0.1", "optimized"),
            (1, "127.0.0.2", "non-optimized"),
        ] {
            let d = format!("sys/class/nvme/nvme{c}");
            w(&format!("{d}/transport"), "tcp");
            w(
                &format!("{d}/address"),
                &format!("traddr={addr},trsvcid=4420,src_addr={addr}"),
            );
            w(&format!("{d}/state"), "live");
            w(&format!("{d}/subsysnqn"), nqn);
            w(&format!("{d}/cntlid"), &(c + 1).to_string());
            w(&format!("{d}/hostnqn"), "nqn.2014-08.org.nvmexpress:uuid:h");
            w(&format!("{d}/nvme0c{c}n1/ana_state"), ana);
            w(&format!("{d}/nvme0c{c}n1/nsid"), "1");
        }
        let s = "sys/class/nvme-subsystem/nvme-subsys0";
        w(&format!("{s}/subsysnqn"), nqn);
        w(&format!("{s}/iopolicy"), "numa");
        for e in ["nvme0", "nvme1", "nvme0n1"] {
            fs::create_dir_all(dir.join(s).join(e)).unwrap();
        }
        let b = "sys/class/block/nvme0n1";
        w(&format!("{b}/nsid"), "1");
        w(
            &format!("{b}/wwid"),
            "uuid.6c1d8a70-1c9e-4d5e-9a40-3b4c5d6e7f80",
        );
        w(&format!("{b}/size"), "131072");
        w(&format!("{b}/dev"), "259:0");
    }

    #[test]
    fn a_head_its_paths_and_their_controllers_are_read_from_sysfs() {
        let dir = std::env::temp_dir().join(format!("lunkit-nvme-tree-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        tree(&dir);
        let root = Root::new(&dir);

        let cs = controllers(&root).unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[1].name, "nvme1");
        assert_eq!(cs[1].cntlid, Some(2));
        assert_eq!(cs[1].state.as_deref(), Some("live"));
        assert_eq!(cs[1].parsed_state, Some(CtrlState::Live));
        assert_eq!(cs[1].address_field("traddr"), Some("127.0.0.2"));
        assert_eq!(cs[1].address_field("trsvcid"), Some("4420"));
        assert_eq!(cs[1].address_field("host_iface"), None);
        assert_eq!(cs[0].namespaces, ["nvme0c0n1"]);

        let ss = subsystems(&root).unwrap();
        assert_eq!(ss.len(), 1);
        assert_eq!(ss[0].nqn.as_deref(), Some("nqn.2014-08.org.lunkit:lab"));
        assert_eq!(ss[0].controllers, ["nvme0", "nvme1"]);
        assert_eq!(ss[0].namespaces, ["nvme0n1"]);

        let ns = namespaces(&root).unwrap();
        assert_eq!(ns.len(), 1);
        assert_eq!(ns[0].nsid, Some(1));
        assert_eq!(ns[0].size_bytes, Some(64 << 20));
        let paths: Vec<(&str, &str, Option<&str>)> = ns[0]
            .paths
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.controller.as_str(),
                    p.ana_state.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            paths,
            [
                ("nvme0c0n1", "nvme0", Some("optimized")),
                ("nvme0c1n1", "nvme1", Some("non-optimized")),
            ]
        );
        // A name that is no single component is refused, not joined.
        assert!(namespace(&root, "../nvme0n1").is_err());
        assert!(controller(&root, "nvme9").unwrap().is_none());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn address_fields_are_found_by_whole_key() {
        let a = "traddr=10.0.0.1,trsvcid=4420,host_traddr=10.0.0.9,src_addr=10.0.0.9";
        assert_eq!(address_field(a, "traddr"), Some("10.0.0.1"));
        assert_eq!(address_field(a, "host_traddr"), Some("10.0.0.9"));
        assert_eq!(address_field(a, "addr"), None);
        assert_eq!(address_field("", "traddr"), None);
    }

    #[test]
    fn namespace_names() {
        for yes in ["nvme0n1", "nvme12n3", "nvme0c1n1"] {
            assert!(is_namespace(yes), "{yes}");
        }
        for no in [
            "nvme0",
            "nvme0n",
            "nvmen1",
            "nvme0n1p1",
            "nvme-subsys0",
            "ng0n1",
        ] {
            assert!(!is_namespace(no), "{no}");
        }
    }

    #[test]
    fn controller_states_parse_and_keep_their_spelling() {
        for (raw, state) in [
            ("new", CtrlState::New),
            ("live", CtrlState::Live),
            ("resetting", CtrlState::Resetting),
            ("connecting", CtrlState::Connecting),
            ("deleting", CtrlState::Deleting),
            ("deleting (no IO)", CtrlState::DeletingNoIo),
            ("dead", CtrlState::Dead),
        ] {
            assert_eq!(CtrlState::parse(raw), state);
            assert_eq!(state.as_str(), raw);
        }
        // A spelling this crate does not know (a newer kernel's, or the kernel's own
        // "unknown state") is kept as written, and is neither live nor on its way back.
        let odd = CtrlState::parse("unknown state");
        assert_eq!(odd, CtrlState::Other("unknown state".into()));
        assert_eq!(odd.to_string(), "unknown state");
        assert!(!odd.is_reconnecting() && !odd.is_going());
        // Case matters: the kernel writes lower case, "Live" is not it.
        assert_eq!(CtrlState::parse("Live"), CtrlState::Other("Live".into()));
    }

    #[test]
    fn reconnecting_and_going_controllers() {
        let reconnecting: Vec<_> = ["new", "resetting", "connecting"]
            .map(CtrlState::parse)
            .into();
        assert!(reconnecting.iter().all(CtrlState::is_reconnecting));
        assert!(!reconnecting.iter().any(CtrlState::is_going));
        let going: Vec<_> = ["deleting", "deleting (no IO)", "dead"]
            .map(CtrlState::parse)
            .into();
        assert!(going.iter().all(CtrlState::is_going));
        assert!(!going.iter().any(CtrlState::is_reconnecting));
        assert!(!CtrlState::Live.is_reconnecting() && !CtrlState::Live.is_going());
    }
}
