//! What of the node an in-use check reads once for every set of devices it asks about:
//! active swap devices and bound loop devices with their backing.

use std::time::Instant;

use super::in_use::{Family, node_number, swaps};
use super::loopdev::{Backing, LoopDevice};
use super::usage::{LoopUse, Unchecked, Usage};
use crate::error::Result;
use crate::id::DevNum;
use crate::root::Root;

/// The family's devices used as swap, or backing a loop device (a loop device whose backing
/// cannot be read is unchecked).
pub(super) fn swaps_and_loops(family: &Family, node: &SwapsAndLoops, usage: &mut Usage) {
    let numbers = family.numbers();
    for d in node.swaps.iter().filter(|d| numbers.contains(d)) {
        usage.swaps.push(family.name_of(*d));
    }
    for (lo, backing) in &node.loops {
        match backing {
            Ok(Some(b)) => {
                if let Some(d) = b.uses_any(&numbers) {
                    usage.loops.push(LoopUse {
                        loop_device: lo.node.name.clone(),
                        backing_file: lo.backing_file.clone(),
                        device: family.name_of(d),
                    });
                }
            }
            Ok(None) => {}
            Err(reason) => usage.unchecked.push(Unchecked {
                what: format!("loop device {}", lo.node.name),
                reason: format!("its backing {}: {reason}", lo.backing_file.display()),
            }),
        }
    }
}

/// The node's active swap devices and bound loop devices with what backs each, read once
/// for every set a check asks about.
pub(super) struct SwapsAndLoops {
    swaps: Vec<DevNum>,
    /// Each bound loop device and its backing (`Err`: why it could not be read).
    loops: Vec<(LoopDevice, std::result::Result<Option<Backing>, String>)>,
}

impl SwapsAndLoops {
    /// `/proc/swaps` and the bound loop devices, each loop's backing given until `deadline`.
    pub(super) fn read(root: &Root, deadline: Instant) -> Result<SwapsAndLoops> {
        let swaps = swaps(root)?
            .iter()
            .filter_map(|s| node_number(root, s))
            .collect();
        let loops = super::loopdev::bound(root)?
            .into_iter()
            .map(|lo| {
                let b = super::loopdev::backing(root, &lo, deadline).map_err(|e| e.to_string());
                (lo, b)
            })
            .collect();
        Ok(SwapsAndLoops { swaps, loops })
    }
}
