//! What the in-use check ([`usage`](super::usage())) found: [`Usage`] and its parts,
//! re-exported as `lunkit::block::*`.

use std::fmt;
use std::path::PathBuf;

use super::mountinfo;
use crate::error::Error;

/// Who uses a set of devices. Empty means nothing the kernel or this node knows of would
/// notice the devices going away.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Filesystems mounted from the devices, their partitions or anything stacked on them,
    /// and bind mounts of their device nodes, in every mount namespace found.
    pub mounts: Vec<MountUse>,
    /// Loop devices whose backing file is one of the devices' nodes (through any path or
    /// bind mount: kubelet's raw-block "descriptor lock"), or a file on a filesystem on one.
    pub loops: Vec<LoopUse>,
    /// Devices stacked on them that are not part of the volume (LVM, md, a foreign dm map).
    pub holders: Vec<String>,
    /// Active swap areas on them.
    pub swaps: Vec<String>,
    /// Processes holding one of them open.
    pub openers: Vec<Opener>,
    /// Processes with one of them memory-mapped (`/proc/PID/maps`), whether or not they
    /// still hold a descriptor of it: a mapping keeps the device open. `read_only` means no
    /// mapping of it is shared and writable.
    pub mapped: Vec<Opener>,
    /// Open file descriptors of path managers (see [`UsageScope::ignore_openers`](super::UsageScope::ignore_openers)): any of
    /// theirs on a path device (multipathd's checkers, udev's probes), and only read-only
    /// ones (udev's probes) on a map or partition. Not users, but listed so that a caller
    /// can tell whether they explain a device's whole open count.
    pub managers: Vec<Opener>,
    /// Descriptors of this process's own helper threads: a flush or probe an earlier call
    /// gave up waiting for, still in its kernel call (see [`flush`](super::flush)). Not users: the step
    /// that needs the device waits for them, within its deadline.
    pub helpers: Vec<Opener>,
    /// Devices an `O_EXCL` open finds claimed, where nothing above explains the claim.
    pub claimed: Vec<String>,
    /// What could not be looked at (a process whose fds or mount table could not be read, a
    /// loop device whose backing could not be read): the check is partial, so the devices
    /// cannot be called unused.
    pub unchecked: Vec<Unchecked>,
    /// Mount table lines that did not parse and were passed over (see
    /// [`mountinfo::parse_table`]); one whose device field names one of the devices is in
    /// `unchecked` as well.
    pub mountinfo_skipped: usize,
}

/// How a device is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// A filesystem on the device.
    Filesystem,
    /// The device's node itself, bind-mounted onto a file (how kubelet publishes a raw
    /// block volume into a pod).
    DeviceNode,
}

/// The mount namespace a mount was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountNamespace {
    /// Its `ns/mnt` inode, when it could be read.
    pub inode: Option<u64>,
    /// A process in it whose table was read; `None` for this process's own.
    pub pid: Option<u32>,
}

impl fmt::Display for MountNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "mount namespace of pid {pid}")?,
            None => f.write_str("this process's mount namespace")?,
        }
        if let Some(i) = self.inode {
            write!(f, " mnt:[{i}]")?;
        }
        Ok(())
    }
}

/// A mount of one of the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountUse {
    /// The device mounted (`sdc1`, `dm-0`).
    pub device: String,
    /// Where it is mounted, as its namespace sees it.
    pub mount_point: PathBuf,
    /// A filesystem, or a bind mount of the node.
    pub kind: MountKind,
    /// Where the mount was seen.
    pub namespace: MountNamespace,
}

impl fmt::Display for MountUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = mountinfo::show(&self.mount_point);
        match self.kind {
            MountKind::Filesystem => write!(f, "{} mounted at {at}", self.device)?,
            MountKind::DeviceNode => {
                write!(f, "node /dev/{} bind-mounted at {at}", self.device)?;
            }
        }
        write!(f, " ({})", self.namespace)
    }
}

/// A loop device backed by one of the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopUse {
    /// The loop device (`loop0`).
    pub loop_device: String,
    /// Its backing file as sysfs names it (the binder's path: a bind mount of the node, the
    /// node itself, or a file on a filesystem on the device).
    pub backing_file: PathBuf,
    /// The device behind it (`dm-0`).
    pub device: String,
}

/// Something the check could not look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unchecked {
    /// What: `pid 42`, `loop3`, `mount table of pid 1`.
    pub what: String,
    /// Why, with the errno.
    pub reason: String,
}

/// A process with one of the devices open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opener {
    /// Its pid.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
    /// The device it has open.
    pub device: String,
    /// The descriptor was opened read-only (`O_RDONLY` in `/proc/PID/fdinfo/FD`): it cannot
    /// have written anything. `false` when it is writable or its mode could not be read.
    pub read_only: bool,
}

impl Usage {
    /// Nothing uses the devices, and everything that could use them was looked at.
    pub fn is_empty(&self) -> bool {
        !self.has_users() && self.unchecked.is_empty()
    }

    /// A user was found: a mount, loop device, holder, swap, opener or exclusive claim.
    pub fn has_users(&self) -> bool {
        !(self.mounts.is_empty()
            && self.loops.is_empty()
            && self.holders.is_empty()
            && self.swaps.is_empty()
            && self.openers.is_empty()
            && self.mapped.is_empty()
            && self.claimed.is_empty())
    }

    /// Only processes hold the devices open: a state that may pass on its own (udev's
    /// probes open every new disk for a moment), unlike a mount or a holder.
    pub fn only_openers(&self) -> bool {
        !self.openers.is_empty()
            && self.mounts.is_empty()
            && self.loops.is_empty()
            && self.holders.is_empty()
            && self.swaps.is_empty()
            && self.mapped.is_empty()
            && self.claimed.is_empty()
            && self.unchecked.is_empty()
    }

    /// The refusal to take `device` away, or `None` when nothing uses it:
    /// [`Error::Busy`] when a user was found, [`Error::Unverified`] when none was but the
    /// check could not look everywhere.
    pub fn refusal(&self, device: &str) -> Option<Error> {
        if self.has_users() {
            Some(Error::Busy {
                device: device.to_owned(),
                reason: self.to_string(),
                usage: Some(Box::new(self.clone())),
            })
        } else if !self.unchecked.is_empty() {
            Some(Error::Unverified {
                device: device.to_owned(),
                reason: self.to_string(),
                usage: Some(Box::new(self.clone())),
            })
        } else {
            None
        }
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for m in &self.mounts {
            parts.push(m.to_string());
        }
        for l in &self.loops {
            parts.push(format!(
                "loop device {} is backed by {} (backing file {})",
                l.loop_device,
                l.device,
                mountinfo::show(&l.backing_file)
            ));
        }
        if !self.holders.is_empty() {
            parts.push(format!("held by {}", self.holders.join(" ")));
        }
        for s in &self.swaps {
            parts.push(format!("active swap on {s}"));
        }
        for o in &self.openers {
            parts.push(format!("{} open by pid {} ({})", o.device, o.pid, o.comm));
        }
        for m in &self.mapped {
            parts.push(format!(
                "{} memory-mapped by pid {} ({})",
                m.device, m.pid, m.comm
            ));
        }
        for c in &self.claimed {
            parts.push(format!("{c} claimed exclusively (O_EXCL open gives EBUSY)"));
        }
        for u in &self.unchecked {
            parts.push(format!("could not check {}: {}", u.what, u.reason));
        }
        if parts.is_empty() {
            f.write_str("not in use")
        } else {
            f.write_str(&parts.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_message_names_every_user() {
        let u = Usage {
            mounts: vec![
                MountUse {
                    device: "sdc1".into(),
                    mount_point: "/mnt/a b".into(),
                    kind: MountKind::Filesystem,
                    namespace: MountNamespace {
                        inode: Some(4026531840),
                        pid: Some(1),
                    },
                },
                MountUse {
                    device: "sdc".into(),
                    mount_point: "/var/lib/kubelet/pods/p/volumeDevices/kubernetes.io~csi/pv"
                        .into(),
                    kind: MountKind::DeviceNode,
                    namespace: MountNamespace {
                        inode: None,
                        pid: None,
                    },
                },
            ],
            loops: vec![LoopUse {
                loop_device: "loop0".into(),
                backing_file: "/var/lib/kubelet/plugins/x/dev/p".into(),
                device: "sdc".into(),
            }],
            holders: vec!["dm-3".into()],
            swaps: vec!["sdc2".into()],
            openers: vec![Opener {
                pid: 42,
                comm: "dd".into(),
                device: "sdc".into(),
                read_only: false,
            }],
            mapped: vec![Opener {
                pid: 43,
                comm: "postgres".into(),
                device: "sdc".into(),
                read_only: false,
            }],
            managers: vec![Opener {
                pid: 7,
                comm: "(udev-worker)".into(),
                device: "sdc".into(),
                read_only: true,
            }],
            helpers: vec![Opener {
                pid: 9,
                comm: "csi-node".into(),
                device: "sdc".into(),
                read_only: true,
            }],
            claimed: vec![],
            unchecked: vec![Unchecked {
                what: "pid 77".into(),
                reason: "its open files (77/fd): Permission denied".into(),
            }],
            mountinfo_skipped: 0,
        };
        assert_eq!(
            u.to_string(),
            "sdc1 mounted at /mnt/a b (mount namespace of pid 1 mnt:[4026531840]); \
             node /dev/sdc bind-mounted at /var/lib/kubelet/pods/p/volumeDevices/kubernetes.io~csi/pv \
             (this process's mount namespace); \
             loop device loop0 is backed by sdc (backing file /var/lib/kubelet/plugins/x/dev/p); \
             held by dm-3; active swap on sdc2; sdc open by pid 42 (dd); \
             sdc memory-mapped by pid 43 (postgres); could not check pid 77: its open files (77/fd): Permission denied"
        );
        assert!(!u.is_empty());
        assert!(!u.only_openers());
        assert_eq!(Usage::default().to_string(), "not in use");
    }
}
