//! What the kernel says of a finding's state beyond the snapshot, added to its `why`: whether
//! a map with no working path queues I/O (its device-mapper table), how long the kernel goes
//! on reconnecting an NVMe controller (`ctrl_loss_tmo`), and how long doctor has seen a
//! recoverable state.

use super::{Finding, Kind};
use crate::block;
use crate::dm::{Control, DevId};
use crate::multipath::Table;
use crate::nvme::sysfs::controller_dir;
use crate::root::Root;
use crate::sysfs::attr;

/// Adds to each finding's `why` what the kernel says of its state, and sets
/// [`Finding::queues`] on map findings. What cannot be read is left unsaid: the finding
/// stands without it.
pub(super) fn explain(root: &Root, findings: &mut [Finding]) {
    let mut control = None;
    for f in findings.iter_mut() {
        match f.kind {
            Kind::MapWithoutPaths | Kind::MapPathsDown => {
                let ctl = control.get_or_insert_with(|| Control::open(root).ok());
                f.queues = ctl.as_ref().and_then(|c| queues(root, c, f));
                if let Some(q) = f.queues {
                    f.why.push_str(queueing(q));
                }
            }
            Kind::NvmeControllerDown => {
                if let Some(name) = f.objects.first() {
                    let dir = controller_dir(root, name);
                    let tmo = attr(&dir, "ctrl_loss_tmo");
                    let delay = attr(&dir, "reconnect_delay");
                    f.why
                        .push_str(&reconnects(tmo.as_deref(), delay.as_deref()));
                }
            }
            _ => {}
        }
        if let Some(since) = f.since {
            f.why.push_str(&format!("; seen for {} s", since.as_secs()));
        }
    }
}

/// Whether the map of finding `f` (its `dm-N`, the second object) queues I/O with no path.
fn queues(root: &Root, ctl: &Control, f: &Finding) -> Option<bool> {
    let node = block::by_name(root, f.objects.get(1)?).ok()??;
    let table = ctl.table(&DevId::Dev(node.dev)).ok()?;
    let t = table.first().filter(|t| t.target_type == "multipath")?;
    Some(Table::parse(&t.params).ok()?.queue_if_no_path())
}

/// What queueing means for a map no path serves.
pub(super) fn queueing(queues: bool) -> &'static str {
    match queues {
        true => {
            "; it queues I/O (queue_if_no_path): writes to it hang until a path comes back \
             or queueing is turned off"
        }
        false => "; it fails I/O (no queue_if_no_path)",
    }
}

/// What the kernel does next with a controller that lost its link, from its
/// `ctrl_loss_tmo` (`off`: for ever) and `reconnect_delay` attributes; empty when the
/// kernel does not show them.
pub(super) fn reconnects(ctrl_loss_tmo: Option<&str>, reconnect_delay: Option<&str>) -> String {
    let every = reconnect_delay
        .and_then(|d| d.parse::<u32>().ok())
        .map(|d| format!(" every {d} s"))
        .unwrap_or_default();
    match ctrl_loss_tmo {
        Some("off") => format!("; the kernel reconnects{every} for ever (ctrl_loss_tmo off)"),
        Some(t) if t.parse::<u32>().is_ok() => format!(
            "; the kernel reconnects{every} until {t} s after the loss (ctrl_loss_tmo), then \
             deletes it"
        ),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_reconnect_policy_is_said_as_it_is() {
        assert_eq!(
            reconnects(Some("off"), Some("10")),
            "; the kernel reconnects every 10 s for ever (ctrl_loss_tmo off)"
        );
        assert!(reconnects(Some("600"), None).contains("until 600 s after the loss"));
        assert_eq!(reconnects(None, Some("10")), "");
        assert_eq!(reconnects(Some("garbage"), Some("x")), "");
        assert!(queueing(true).contains("hang"));
        assert!(queueing(false).contains("fails"));
    }
}
