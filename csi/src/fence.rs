//! Fencing (`fencing: scsi-pr`): one writer per volume across nodes, enforced by the array
//! with SCSI-3 persistent reservations ([`lunkit::pr`]).
//!
//! - **Stage**, after the attach and before the filesystem: this node's key
//!   ([`lunkit::pr::Key::for_node`], from `<root>/etc/machine-id`) is registered on every path
//!   of the volume (REGISTER AND IGNORE EXISTING KEY, so a stage again after a restart finds
//!   it as it left it), then the reservation is taken through one path: *Write Exclusive,
//!   Registrants Only* for a single-node access mode, *Write Exclusive, All Registrants* for
//!   a multi-node one. What to do about a reservation already held is [`decide`]'s: another
//!   node's key holding a single-node volume is preempted and aborted (`fencingPreempt:
//!   always`) or the stage is refused naming it (`never`), and then nothing of the stage is
//!   left (its registrations, devices and sessions are taken out again).
//! - **Unstage**, inside the detach ([`Release`]), at its last moment with the volume in
//!   place: after the detach's in-use check found nothing using it and its maps are flushed
//!   (a lone disk is flushed by the release itself), before anything is removed. The
//!   reservation is released when this node's key holds it ([`to_release`]: never an
//!   all-registrants one, which the last registrant's unregistration ends), then the key is
//!   unregistered on every path. A path whose key is gone (another node preempted it) is not
//!   an error. Another node's registration is never touched: every request carries this
//!   node's key. A volume still in use is refused by the detach before the release: it keeps
//!   its reservation, and one walk over the processes serves the check.
//!
//! The record keeps the key and the type ([`Fence`], in the SCSI target), written before
//! anything is registered, so that an unstage after a plugin restart still releases.

use std::time::{Duration, Instant};

use lunkit::block::BlockNode;
use lunkit::ops::{self, VolumeSpec, VolumeState};
use lunkit::pr::{self, Holder, Key, ReservationType};
use lunkit::scsi::sysfs::ScsiState;
use lunkit::{ErrorKind, Root, Wwid};
use serde::{Deserialize, Serialize};

use crate::attrs::{Fencing, Preempt, Volume};
use crate::error::{Error, Result};
use crate::log::{self, Level};
use crate::node::Inner;
use crate::proto::NodeStageVolumeRequest;
use crate::proto::volume_capability::access_mode::Mode;
use crate::state::{Record, Target};

/// A fenced SCSI volume's reservation (`fencing: scsi-pr`), kept in its record's SCSI
/// target, since only SCSI volumes are fenced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Fence {
    /// This node's key as registered (`0x` and 16 hex digits): unstage unregisters this
    /// one, even if the node's key were derived differently by then.
    pub key: String,
    /// A multi-node access mode: *Write Exclusive, All Registrants*, never released by one
    /// node (the last registrant's unregistration ends it); otherwise *Write Exclusive,
    /// Registrants Only*, held by this node alone.
    pub multi_node: bool,
}

impl Fence {
    /// The key recorded.
    pub fn key(&self) -> Result<Key> {
        self.key
            .parse()
            .map_err(|e| Error::Internal(format!("the record's fencing key: {e}")))
    }

    /// The reservation type taken.
    pub fn kind(&self) -> ReservationType {
        if self.multi_node {
            ReservationType::WriteExclusiveAllRegistrants
        } else {
            ReservationType::WriteExclusiveRegistrantsOnly
        }
    }
}

impl Target {
    /// The fence of a SCSI volume that is fenced.
    pub fn fence(&self) -> Option<&Fence> {
        match self {
            Target::Iscsi { fence, .. } | Target::Fc { fence, .. } => fence.as_ref(),
            Target::Nvme { .. } => None,
        }
    }

    /// Sets the fence of a SCSI volume (an NVMe target has none: its attributes refuse one).
    pub fn set_fence(&mut self, to: Option<Fence>) {
        if let Target::Iscsi { fence, .. } | Target::Fc { fence, .. } = self {
            *fence = to;
        }
    }
}

/// Whether an access mode is a multi-node one.
pub fn multi_node(mode: Mode) -> bool {
    matches!(
        mode,
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter
    )
}

/// The fence a stage request asks for, with its preempt policy: `None` unless the volume's
/// attributes say `fencing: scsi-pr`. The key is the node's, from `<root>/etc/machine-id`;
/// without one the stage is refused (FAILED_PRECONDITION) before anything is done.
pub(crate) fn wanted(
    root: &Root,
    vol: &Volume,
    req: &NodeStageVolumeRequest,
) -> Result<Option<(Fence, Preempt)>> {
    let fencing = match vol {
        Volume::Iscsi(v) => v.fencing,
        Volume::Fc(v) => v.fencing,
        Volume::Nvme(_) => Fencing::None,
    };
    let Fencing::ScsiPr { preempt } = fencing else {
        return Ok(None);
    };
    let key = Key::for_node(root).map_err(|e| {
        Error::FailedPrecondition(format!(
            "volume {}: fencing: scsi-pr needs this node's reservation key, derived from \
             {}: {e}",
            req.volume_id,
            root.etc("machine-id").display()
        ))
    })?;
    let mode = req
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_mode)
        .and_then(|m| Mode::try_from(m.mode).ok())
        .unwrap_or(Mode::Unknown);
    let fence = Fence {
        key: key.to_string(),
        multi_node: multi_node(mode),
    };
    Ok(Some((fence, preempt)))
}

/// What a stage does about the reservation it finds, once its key is registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// It holds what the stage wants already (a stage again): nothing.
    Held,
    /// None is held: reserve.
    Reserve,
    /// Another node's key holds a single-node volume: PREEMPT AND ABORT it.
    PreemptAbort(Key),
    /// Refuse the stage (FAILED_PRECONDITION), for this reason.
    Refuse(String),
}

pub(crate) fn all_registrants(kind: ReservationType) -> bool {
    matches!(
        kind,
        ReservationType::WriteExclusiveAllRegistrants
            | ReservationType::ExclusiveAccessAllRegistrants
    )
}

/// What a stage with key `ours`, wanting a reservation of type `want`, does about `holder`
/// (READ RESERVATION's, after its registration). An all-registrants reservation reports key
/// 0 and is held by every registrant, so a multi-node stage finds it held once registered.
/// A multi-node stage never preempts; nor does any stage preempt an all-registrants
/// reservation or one of its own key of another type.
pub fn decide(holder: Option<&Holder>, ours: Key, want: ReservationType, preempt: Preempt) -> Step {
    let Some(h) = holder else {
        return Step::Reserve;
    };
    let everyone = h.kind.is_some_and(all_registrants);
    if h.kind == Some(want) && (h.key == ours || everyone) {
        return Step::Held;
    }
    let held_as = h
        .kind
        .map_or_else(|| format!("type code {}", h.type_code), |k| k.to_string());
    if h.key == ours {
        return Step::Refuse(format!(
            "the reservation is held by this node's key {ours} as {held_as}, not {want}; \
             unstage the volume first"
        ));
    }
    if everyone {
        return Step::Refuse(format!(
            "the reservation is held as {held_as} by every registrant (a multi-node \
             volume's), not {want}; it is not preempted"
        ));
    }
    if all_registrants(want) {
        return Step::Refuse(format!(
            "the reservation is held by key {} as {held_as}; a multi-node volume ({want}) \
             never preempts",
            h.key
        ));
    }
    match preempt {
        Preempt::Always => Step::PreemptAbort(h.key),
        Preempt::Never => Step::Refuse(format!(
            "the reservation is held by key {} as {held_as}, and fencingPreempt is never",
            h.key
        )),
    }
}

/// The reservation type an unstage with key `ours` releases: the one `holder` reports when
/// `ours` holds it, unless it is an all-registrants one (held by every registrant: one
/// node's release would end it for all; its unregistration is enough).
pub fn to_release(holder: Option<&Holder>, ours: Key) -> Option<ReservationType> {
    let h = holder?;
    let kind = h.kind?;
    (h.key == ours && !all_registrants(kind)).then_some(kind)
}

/// Whether a lunkit error is a RESERVATION CONFLICT.
fn conflict(e: &lunkit::Error) -> bool {
    e.kind() == ErrorKind::ReservationConflict
}

/// The volume's paths on the node now, found by its known WWID: each with its disk and
/// whether it runs; empty when it has no WWID yet or nothing of it is here.
pub(crate) fn volume_paths(
    root: &Root,
    record: &Record,
    deadline: Instant,
) -> Result<Vec<(BlockNode, bool)>> {
    let Some(Ok(wwid)) = record.known_wwid().map(str::parse::<Wwid>) else {
        return Ok(Vec::new());
    };
    let what = || format!("volume {}: find its paths", record.volume_id);
    let state = ops::volume::identify(root, &VolumeSpec::Wwid(wwid))
        .and_then(|i| ops::volume::locate_until(root, &i, deadline))
        .map_err(|e| Error::lunkit(what(), e))?;
    Ok(state
        .paths
        .into_iter()
        .filter_map(|p| {
            let running = p.state == Some(ScsiState::Running);
            p.disk.map(|d| (d, running))
        })
        .collect())
}

impl Inner {
    /// The stage's fencing, once the volume is attached as `device`: this node's key
    /// registered on every path, then the reservation taken (or found held, or another
    /// node's preempted and aborted) through the first path, as [`decide`] says. A refusal
    /// is FAILED_PRECONDITION naming the device and the holding key. Returns the paths
    /// registered.
    pub(crate) fn fence_stage(
        &self,
        record: &Record,
        device: &BlockNode,
        preempt: Preempt,
        deadline: Instant,
    ) -> Result<Vec<BlockNode>> {
        let Some(fence) = record.target.fence() else {
            return Ok(Vec::new());
        };
        let (id, key, want) = (record.volume_id.as_str(), fence.key()?, fence.kind());
        let mut paths: Vec<BlockNode> = volume_paths(self.root(), record, deadline)?
            .into_iter()
            .map(|(d, _)| d)
            .collect();
        if paths.is_empty() {
            paths.push(device.clone());
        }
        for p in &paths {
            pr::register_ignore(p, key, deadline)
                .map_err(|e| Error::lunkit(format!("volume {id}: register key {key} on {p}"), e))?;
        }
        // Owned: `paths` itself is returned from inside the loop below.
        let through = &paths[0].clone();
        let lunkit_err = |what: &str, e| Error::lunkit(format!("volume {id}: {what} {through}"), e);
        // Twice at most: another node may take or drop the reservation between the read
        // and the request, which is then refused with RESERVATION CONFLICT.
        for _ in 0..2 {
            let held = pr::read_reservation(through, deadline)
                .map_err(|e| lunkit_err("read the reservation of", e))?;
            let done = match decide(held.holder.as_ref(), key, want, preempt) {
                Step::Held => return Ok(paths),
                Step::Reserve => pr::reserve(through, key, want, deadline),
                Step::PreemptAbort(victim) => {
                    log::note(
                        Level::Warn,
                        &format!(
                            "volume {id}: {through}: key {victim} holds the reservation; \
                             preempting and aborting it with this node's key {key}"
                        ),
                    );
                    pr::preempt_abort(through, key, victim, want, deadline)
                }
                Step::Refuse(why) => {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id}: {through}: {why}; this node's key is {key}"
                    )));
                }
            };
            match done {
                Ok(()) => return Ok(paths),
                Err(e) if conflict(&e) => continue,
                Err(e) => return Err(lunkit_err(&format!("reserve ({want}) with key {key}"), e)),
            }
        }
        Err(Error::FailedPrecondition(format!(
            "volume {id}: {through}: the reservation changed hands twice while this stage \
             took it with key {key}; try again"
        )))
    }

    /// The error of a stage whose fencing failed: a refusal (FAILED_PRECONDITION) leaves
    /// nothing of the stage behind, so the stage is undone as an unstage would (this node's
    /// key unregistered, the devices detached, the sessions no other volume uses logged
    /// out, the record removed); any other error leaves the record for a retry or unstage.
    pub(crate) fn fence_refused(&self, id: &str, staging: &std::path::Path, e: Error) -> Error {
        let Error::FailedPrecondition(why) = e else {
            return e;
        };
        match self.unstage(id, staging) {
            Ok(()) => Error::FailedPrecondition(format!(
                "{why}; this stage's registrations, devices and sessions were taken out again"
            )),
            Err(u) => {
                Error::FailedPrecondition(format!("{why}; taking this stage out again failed: {u}"))
            }
        }
    }
}

/// A fenced unstage's release ([`lunkit::ops::detach_before_removal`]'s step): the detach's
/// in-use check found nothing using the volume and its maps are flushed; nothing is removed
/// yet.
pub(crate) struct Release<'a> {
    record: &'a Record,
    key: Key,
    deadline: Instant,
    /// The plugin's error of a release that failed, which ended the detach.
    failed: Option<Error>,
}

impl<'a> Release<'a> {
    /// The release of `record`'s fence; `None` for a volume that is not fenced.
    pub(crate) fn of(record: &'a Record, deadline: Instant) -> Result<Option<Release<'a>>> {
        let Some(fence) = record.target.fence() else {
            return Ok(None);
        };
        Ok(Some(Release {
            record,
            key: fence.key()?,
            deadline,
            failed: None,
        }))
    }

    /// The detach's step ([`Release::release`]). A failure ends the detach with nothing
    /// removed, and is kept for [`Release::error`].
    pub(crate) fn step(&mut self, volume: &VolumeState) -> lunkit::Result<()> {
        self.release(volume).map_err(|e| {
            let what = e.to_string();
            self.failed = Some(e);
            lunkit::Error::Internal { what }
        })
    }

    /// What an unstage whose detach ended with `e` reports: the release's own error when
    /// the release ended it.
    pub(crate) fn error(&mut self, e: Error) -> Error {
        self.failed.take().unwrap_or(e)
    }

    /// A lone disk flushed (while this node may still write), the reservation released if
    /// this node's key holds it, and the key unregistered on every running path. A path the
    /// key is not registered through (another node preempted it) is skipped, and so is a
    /// path that is not running (its registration stays on the array; the log names it).
    fn release(&self, volume: &VolumeState) -> Result<()> {
        let (id, key, deadline) = (self.record.volume_id.as_str(), self.key, self.deadline);
        let (up, down): (Vec<_>, Vec<_>) = volume
            .paths
            .iter()
            .filter_map(|p| Some((p.disk.clone()?, p.state == Some(ScsiState::Running))))
            .partition(|(_, running)| *running);
        for (p, _) in &down {
            log::note(
                Level::Warn,
                &format!("volume {id}: {p} is not running: key {key} stays registered through it"),
            );
        }
        let up: Vec<BlockNode> = up.into_iter().map(|(d, _)| d).collect();
        let Some(first) = up.first() else {
            return Ok(());
        };
        // The detach flushed the maps; a disk with no map over it is written here.
        if volume.maps.is_empty() {
            let soon = deadline.min(Instant::now() + Duration::from_secs(10));
            for p in &up {
                if let Err(e) = lunkit::block::flush(p, soon) {
                    log::note(
                        Level::Warn,
                        &format!("volume {id}: flush before release: {e}"),
                    );
                }
            }
        }
        let err = |what: String| move |e| Error::lunkit(format!("volume {id}: {what}"), e);
        let held = pr::read_reservation(first, deadline)
            .map_err(err(format!("read the reservation of {first}")))?;
        if let Some(kind) = to_release(held.holder.as_ref(), key) {
            // Only the holding path's RELEASE ends it; the other registered paths' do
            // nothing (SPC-4 5.14.11.2), so every path is asked.
            for p in &up {
                match pr::release(p, key, kind, deadline) {
                    Err(e) if !conflict(&e) => {
                        return Err(err(format!("release key {key}'s reservation on {p}"))(e));
                    }
                    _ => {}
                }
            }
        }
        let mut gone = Vec::new();
        for p in &up {
            match pr::unregister(p, key, deadline) {
                Ok(()) => {}
                Err(e) if conflict(&e) => gone.push(p.to_string()),
                Err(e) => return Err(err(format!("unregister key {key} on {p}"))(e)),
            }
        }
        if !gone.is_empty() {
            log::note(
                Level::Warn,
                &format!(
                    "volume {id}: key {key} was not registered through {} (preempted by \
                     another node?): nothing to undo there",
                    gone.join(", ")
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "fence_tests.rs"]
mod tests;
