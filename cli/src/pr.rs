//! `lunkit pr`: SCSI-3 persistent reservations on a disk or a multipath map, without
//! `sg_persist` or `mpathpersist`.

use clap::{Args, Subcommand};
use lunkit::block::{self, BlockNode};
use lunkit::pr::{self, Key, ReservationType};
use lunkit::{Error, Root};

use crate::json::{self, Layout};

#[derive(Subcommand)]
pub enum Pr {
    /// Show the keys and the reservation through every path of a device.
    ///
    /// Reads PERSISTENT RESERVE IN (READ KEYS, READ RESERVATION) through each path of a
    /// multipath map, or through a lone disk. Exit 0 read through at least one path, 1 no
    /// path answered, 2 bad input, 3 no such device, 5 deadline passed.
    Show {
        #[command(flatten)]
        device: Device,
    },
    /// Print this node's key, derived from /etc/machine-id (under --root).
    ///
    /// Exit 0 printed, 2 no usable machine-id, 3 none.
    Key,
    /// Register a key on the device (every path of a map).
    ///
    /// Exit 0 registered, 2 bad input, 3 no such device, 4 refused (RESERVATION CONFLICT:
    /// the path has another key; --ignore-existing replaces it), 5 deadline passed.
    Register {
        #[command(flatten)]
        device: Device,
        /// Replace whatever key this node has registered (REGISTER AND IGNORE EXISTING KEY).
        #[arg(long)]
        ignore_existing: bool,
    },
    /// Drop the key's registration (and a registrants-only reservation it holds).
    ///
    /// Exit 0 unregistered, 2 bad input, 3 no such device, 4 refused (not registered with
    /// that key), 5 deadline passed.
    Unregister {
        #[command(flatten)]
        device: Device,
    },
    /// Take a reservation with a registered key.
    ///
    /// Exit 0 reserved (or already held by the key), 2 bad input, 3 no such device, 4
    /// refused (another key holds it, or the key is not registered), 5 deadline passed.
    Reserve {
        #[command(flatten)]
        device: Device,
        #[command(flatten)]
        kind: Kind,
    },
    /// Release the reservation the key holds.
    ///
    /// Exit 0 released (or none held), 2 bad input, 3 no such device, 4 refused (the key
    /// is not registered, or the type is not the one held), 5 deadline passed.
    Release {
        #[command(flatten)]
        device: Device,
        #[command(flatten)]
        kind: Kind,
    },
    /// Remove another key's registrations and reservation, taking the reservation.
    ///
    /// Refused without --force when another key holds the device. Exit 0 preempted, 2 bad
    /// input, 3 no such device, 4 refused (another key holds it and no --force, or the
    /// device refused), 5 deadline passed.
    Preempt {
        #[command(flatten)]
        device: Device,
        #[command(flatten)]
        kind: Kind,
        /// The key to preempt [default: the key holding the reservation].
        #[arg(long, value_name = "K")]
        victim: Option<Key>,
        /// Also abort the preempted key's commands in flight (PREEMPT AND ABORT).
        #[arg(long)]
        abort: bool,
        /// Preempt even when another key holds the device (that node's writes fail).
        #[arg(long)]
        force: bool,
    },
    /// Drop every registration and the reservation.
    ///
    /// Refused without --force when another key holds the device or is registered. Exit 0
    /// cleared, 2 bad input, 3 no such device, 4 refused, 5 deadline passed.
    Clear {
        #[command(flatten)]
        device: Device,
        /// Clear even when another key holds the device or is registered.
        #[arg(long)]
        force: bool,
    },
}

/// The device and key every `pr` command takes.
#[derive(Args)]
pub struct Device {
    /// The device: a /dev path, a kernel name (sdc, dm-0) or an H:C:T:L.
    device: String,
    /// The key: 0x and hex digits, or a number [default: this node's, `lunkit pr key`].
    #[arg(long, value_name = "K")]
    key: Option<Key>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    timeout: f64,
    /// Print the result as one JSON object (with `elapsed_us`, the library's time).
    #[arg(long)]
    json: bool,
}

/// The reservation type.
#[derive(Args)]
pub struct Kind {
    /// The reservation type: we, ea, we-ro, ea-ro, we-ar, ea-ar (or write-exclusive,
    /// exclusive-access, write-exclusive-registrants-only, ...).
    #[arg(long = "type", value_name = "T", default_value = "we-ro")]
    kind: ReservationType,
}

/// The device, the key and the deadline of a command.
struct Target {
    node: BlockNode,
    key: Key,
    deadline: std::time::Instant,
    /// When the command began, for `elapsed_us`.
    started: std::time::Instant,
    json: bool,
}

impl Device {
    fn target(&self, root: &Root) -> lunkit::Result<Target> {
        let started = std::time::Instant::now();
        if self.key.is_some_and(Key::is_zero) {
            return Err(Error::invalid(
                "--key",
                "0",
                "0 is no key (unregister drops a key)",
            ));
        }
        let deadline = lunkit::wait::deadline_after(crate::seconds(self.timeout)?);
        let node = block::resolve(root, &self.device)?.ok_or_else(|| Error::NotFound {
            what: format!(
                "no block device {} on this node; give a /dev path, a kernel name (sdc, dm-0) \
                 or an H:C:T:L, as `lunkit list` shows them",
                self.device
            ),
        })?;
        let key = match self.key {
            Some(k) => k,
            None => Key::for_node(root)?,
        };
        Ok(Target {
            node,
            key,
            deadline,
            started,
            json: self.json,
        })
    }
}

pub fn run(root: &Root, cmd: Pr) -> lunkit::Result<()> {
    match cmd {
        Pr::Show { device } => show(root, &device),
        Pr::Key => {
            outln!("{}", Key::for_node(root)?);
            Ok(())
        }
        Pr::Register {
            device,
            ignore_existing,
        } => {
            let t = device.target(root)?;
            match ignore_existing {
                true => pr::register_ignore(&t.node, t.key, t.deadline)?,
                false => pr::register(&t.node, t.key, t.deadline)?,
            }
            done(&t, "registered")
        }
        Pr::Unregister { device } => {
            let t = device.target(root)?;
            pr::unregister(&t.node, t.key, t.deadline)?;
            done(&t, "unregistered")
        }
        Pr::Reserve { device, kind } => {
            let t = device.target(root)?;
            pr::reserve(&t.node, t.key, kind.kind, t.deadline)?;
            done(&t, &format!("reserved ({})", kind.kind))
        }
        Pr::Release { device, kind } => {
            let t = device.target(root)?;
            pr::release(&t.node, t.key, kind.kind, t.deadline)?;
            done(&t, "released")
        }
        Pr::Preempt {
            device,
            kind,
            victim,
            abort,
            force,
        } => preempt(root, &device, kind.kind, victim, abort, force),
        Pr::Clear { device, force } => clear(root, &device, force),
    }
}

fn done(t: &Target, what: &str) -> lunkit::Result<()> {
    if t.json {
        let doc = json::pr::Done::new(&t.node, t.key, what, t.started.elapsed());
        json::print(&doc, Layout::Line);
    } else {
        outln!("{} ({}) key {} {what}", t.node, t.node.dev, t.key);
    }
    Ok(())
}

fn preempt(
    root: &Root,
    device: &Device,
    kind: ReservationType,
    victim: Option<Key>,
    abort: bool,
    force: bool,
) -> lunkit::Result<()> {
    let t = device.target(root)?;
    let held = pr::read_reservation(&t.node, t.deadline)?.holder;
    let holder = held.map(|h| h.key).filter(|k| !k.is_zero());
    let victim = match victim.or(holder) {
        Some(v) => v,
        None => {
            return Err(Error::invalid(
                "--victim",
                "",
                "no reservation is held: name the key to preempt with --victim",
            ));
        }
    };
    if let Some(other) = holder.filter(|&h| h != t.key && !force) {
        return Err(refusal(
            &t,
            &format!("the reservation is held by key {other}"),
            "preempt",
        ));
    }
    let req = pr::Request::Preempt {
        key: t.key,
        victim,
        kind,
        abort,
    };
    pr::request(&t.node, req, t.deadline)?;
    let how = if abort {
        "preempted and aborted"
    } else {
        "preempted"
    };
    done(&t, &format!("{how} key {victim}, reserved ({kind})"))
}

fn clear(root: &Root, device: &Device, force: bool) -> lunkit::Result<()> {
    let t = device.target(root)?;
    if !force {
        let held = pr::read_reservation(&t.node, t.deadline)?.holder;
        if let Some(h) = held.filter(|h| !h.key.is_zero() && h.key != t.key) {
            let why = format!("the reservation is held by key {}", h.key);
            return Err(refusal(&t, &why, "clear"));
        }
        let keys = pr::read_keys(&t.node, t.deadline)?;
        if let Some(other) = keys.keys.iter().find(|&&k| k != t.key) {
            let why = format!("key {other} is registered too");
            return Err(refusal(&t, &why, "clear"));
        }
    }
    pr::clear(&t.node, t.key, t.deadline)?;
    done(&t, "cleared every registration and the reservation")
}

/// The refusal of a preempt or clear that would take the device from another key.
fn refusal(t: &Target, why: &str, what: &str) -> Error {
    Error::Busy {
        device: t.node.to_string(),
        reason: format!(
            "{why} (another node?); nothing was changed: --force to {what} it anyway, and that \
             node's writes fail from then on"
        ),
        usage: None,
    }
}

fn show(root: &Root, device: &Device) -> lunkit::Result<()> {
    let t0 = std::time::Instant::now();
    let deadline = lunkit::wait::deadline_after(crate::seconds(device.timeout)?);
    let node = block::resolve(root, &device.device)?.ok_or_else(|| Error::NotFound {
        what: format!("no block device {} on this node", device.device),
    })?;
    let mut paths = pr::show(root, &node, deadline)?;
    if paths
        .iter()
        .all(|p| p.keys.is_err() && p.reservation.is_err())
    {
        // No path answered: the first path's error is the command's.
        let first = paths.remove(0);
        return Err(first.keys.err().unwrap_or_else(|| Error::Internal {
            what: "a path failed without an error".into(),
        }));
    }
    if device.json {
        json::print(
            &json::pr::Show::new(&node, &paths, t0.elapsed()),
            Layout::Line,
        );
        return Ok(());
    }
    outln!("{node} ({})", node.dev);
    for p in &paths {
        outln!("  {}", path_line(p));
    }
    Ok(())
}

/// One path's line: `sdc (8:32): generation 5, keys 0x… 0x…, reserved by 0x… (we-ro)`.
fn path_line(p: &pr::PathState) -> String {
    let mut line = format!("{} ({}): ", p.path.name, p.path.dev);
    match &p.keys {
        Ok(k) => {
            let keys: Vec<String> = k.keys.iter().map(Key::to_string).collect();
            let keys = if keys.is_empty() {
                "none".to_owned()
            } else {
                keys.join(" ")
            };
            line.push_str(&format!("generation {}, keys {keys}", k.generation));
        }
        Err(e) => line.push_str(&format!("keys not read ({e})")),
    }
    match &p.reservation {
        Ok(r) => match r.holder {
            Some(h) => {
                let kind = h
                    .kind
                    .map_or(format!("type {}", h.type_code), |t| t.to_string());
                line.push_str(&format!(", reserved by {} ({kind})", h.key));
            }
            None => line.push_str(", no reservation"),
        },
        Err(e) => line.push_str(&format!(", reservation not read ({e})")),
    }
    line
}
