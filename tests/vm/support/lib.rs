//! Fixtures for the VM tests: they build a storage lab inside the QEMU guest (scsi_debug, an
//! LIO iSCSI target through configfs, the open-iscsi initiator, multipathd) and tear it down.
//!
//! A crate of its own (`lunkit-lab`, a dev-dependency of the root crate and a dependency of
//! xtask), std only, so that `cargo xtask lab`, the captures of the sysfs fixture trees and the
//! tests share one recipe.
//!
//! Everything here expects to run as root inside the guest booted by `cargo xtask`; call
//! [`require_vm`] first so a test run on a developer's host fails instead of loading modules.

// Test fixtures build the lab with the real tools (modprobe, iscsiadm, multipathd): the
// no-process rule is for the library, not for the lab around it.
#![allow(clippy::disallowed_methods)]

pub mod child;
pub mod cli;
pub mod cmd;
pub mod cmdline;
pub mod diag;
pub mod fcoe;
pub mod iscsi;
pub mod lab;
pub mod lio;
pub mod lio_extra;
pub mod lio_grow;
pub mod lio_split;
pub mod multipath;
pub mod netlink;
pub mod node_b;
pub mod nvmet;
pub mod scsi_debug;
pub mod sysfs;
pub mod tunable;
pub mod udev;
pub mod wait;

/// Fixture errors are reported, not handled: a message saying what failed is enough.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The variable `cargo xtask test` sets in the guest.
pub const VM_ENV: &str = "LUNKIT_VM";

/// Panics unless we run inside the xtask guest: these fixtures load kernel modules and start
/// daemons, which must never happen on a developer's machine by accident.
///
/// In the guest it also installs (once per process) a panic hook that prints
/// [`diag::dump`] right after the panic message: at that moment the lab is still as the
/// failure left it, while the fixtures' `Drop` runs only after the hook and tears it down.
pub fn require_vm() {
    if std::env::var_os(VM_ENV).is_none_or(|v| v != "1") {
        panic!(
            "VM test: run it with `cargo xtask test` (it needs {VM_ENV}=1 inside the QEMU guest)"
        );
    }
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let thread = std::thread::current();
            diag::dump_once(&format!(
                "panic in thread '{}'",
                thread.name().unwrap_or("<unnamed>")
            ));
        }));
    });
}
