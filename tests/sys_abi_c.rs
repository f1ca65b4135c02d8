//! Cross-checks lunkit-sys against the system's C headers. It lives in the root crate, not in
//! sys/, so that nothing under sys/ or src/ spawns a program (the project's red line).
//!
//! Builds a C program with the system C compiler (`$CC`, default `cc`, plus `$CFLAGS`)
//! against `<linux/dm-ioctl.h>`, `<linux/fs.h>`, `<linux/loop.h>`, `<linux/netlink.h>`,
//! `<linux/nvme_ioctl.h>`, `<linux/pr.h>`, `<scsi/sg.h>` and `<sys/socket.h>` (and `<libdevmapper.h>` when
//! installed). The program prints every size, offset, opcode and flag as `EXPR<TAB>VALUE`
//! lines; the test compares each with the Rust value and fails with the list of mismatches.
//!
//! Items newer than the oldest headers we care about carry a guard macro: if the installed
//! headers lack it, the C side prints `MISSING` and the item is reported as skipped instead
//! of failing. Missing kernel headers or compiler fail the test.

// This test runs the C compiler and the program it builds to check the ABI; the workspace
// denies `std::process::Command::new` only to keep the library from spawning programs.
#![allow(clippy::disallowed_methods)]

use std::fmt::Write as _;
use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::process::Command;

use lunkit_sys::block::*;
use lunkit_sys::dm::*;
use lunkit_sys::loop_dev::*;
use lunkit_sys::netlink::*;
use lunkit_sys::nvme::*;
use lunkit_sys::pr::*;
use lunkit_sys::sg::*;

const INSTALL_HINT: &str = "the C ABI cross-check needs a C compiler and the Linux UAPI headers: \
     install them with `apt-get install linux-libc-dev gcc` (or your distribution's equivalent)";

#[derive(Debug)]
enum Val {
    Num(u64),
    Str(&'static str),
}

#[derive(Debug)]
struct Check {
    /// C expression, also the label in reports.
    expr: String,
    /// Macro that must be defined for `expr` to exist in older headers.
    guard: Option<&'static str>,
    rust: Val,
}

fn num(expr: impl Into<String>, guard: Option<&'static str>, v: u64) -> Check {
    Check {
        expr: expr.into(),
        guard,
        rust: Val::Num(v),
    }
}

/// `c!(NAME)` / `c!(NAME if GUARD)`: a C constant with the same name as the Rust one.
macro_rules! c {
    ($name:ident) => {
        num(stringify!($name), None, $name as u64)
    };
    ($name:ident if $guard:ident) => {
        num(stringify!($name), Some(stringify!($guard)), $name as u64)
    };
}

/// `size!(T)`: `sizeof(struct T)`.
macro_rules! size {
    ($t:ident) => {
        num(
            concat!("sizeof(struct ", stringify!($t), ")"),
            None,
            size_of::<$t>() as u64,
        )
    };
    ($t:ident if $guard:ident) => {
        num(
            concat!("sizeof(struct ", stringify!($t), ")"),
            Some(stringify!($guard)),
            size_of::<$t>() as u64,
        )
    };
}

/// `off!(T; f, g, ...)` / `off!(T if GUARD; f, ...)`: `offsetof(struct T, f)` for each field.
macro_rules! off {
    ($t:ident; $($f:ident),+ $(,)?) => {
        off!(@guard None, $t; $($f),+)
    };
    ($t:ident if $guard:ident; $($f:ident),+ $(,)?) => {
        off!(@guard Some(stringify!($guard)), $t; $($f),+)
    };
    (@guard $g:expr, $t:ident; $($f:ident),+) => {
        [$(
            num(
                concat!("offsetof(struct ", stringify!($t), ", ", stringify!($f), ")"),
                $g,
                offset_of!($t, $f) as u64,
            )
        ),+]
    };
}

fn checks() -> Vec<Check> {
    let mut v = Vec::new();

    // <linux/dm-ioctl.h>: structs.
    v.push(size!(dm_ioctl));
    v.extend(
        off!(dm_ioctl; version, data_size, data_start, target_count, open_count, flags,
        event_nr, padding, dev, name, uuid, data),
    );
    v.push(size!(dm_target_spec));
    v.extend(off!(dm_target_spec; sector_start, length, status, next, target_type));
    v.push(size!(dm_target_deps));
    v.extend(off!(dm_target_deps; count, padding));
    v.push(num(
        "offsetof(struct dm_target_deps, dev)",
        None,
        DM_TARGET_DEPS_DEV_OFFSET as u64,
    ));
    v.push(size!(dm_name_list));
    v.extend(off!(dm_name_list; dev, next));
    v.push(num(
        "offsetof(struct dm_name_list, name)",
        None,
        DM_NAME_LIST_NAME_OFFSET as u64,
    ));
    v.push(size!(dm_target_versions));
    v.extend(off!(dm_target_versions; next, version));
    v.push(num(
        "offsetof(struct dm_target_versions, name)",
        None,
        DM_TARGET_VERSIONS_NAME_OFFSET as u64,
    ));
    v.push(size!(dm_target_msg));
    v.extend(off!(dm_target_msg; sector));
    v.push(num(
        "offsetof(struct dm_target_msg, message)",
        None,
        DM_TARGET_MSG_MESSAGE_OFFSET as u64,
    ));
    // Sizes of the fixed-size arrays.
    v.push(num(
        "sizeof(((struct dm_ioctl *)0)->name)",
        None,
        DM_NAME_LEN as u64,
    ));
    v.push(num(
        "sizeof(((struct dm_ioctl *)0)->uuid)",
        None,
        DM_UUID_LEN as u64,
    ));
    v.push(num(
        "sizeof(((struct dm_target_spec *)0)->target_type)",
        None,
        DM_MAX_TYPE_NAME as u64,
    ));

    // <linux/dm-ioctl.h>: constants.
    v.extend([
        c!(DM_MAX_TYPE_NAME),
        c!(DM_NAME_LEN),
        c!(DM_UUID_LEN),
        c!(DM_IOCTL),
        c!(DM_VERSION_MAJOR),
        c!(DM_NAME_LIST_FLAG_HAS_UUID if DM_NAME_LIST_FLAG_HAS_UUID),
        c!(DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID if DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID),
    ]);
    v.push(Check {
        expr: "DM_DIR".into(),
        guard: None,
        rust: Val::Str(DM_DIR),
    });
    v.push(Check {
        expr: "DM_CONTROL_NODE".into(),
        guard: None,
        rust: Val::Str(DM_CONTROL_NODE),
    });
    v.extend([
        c!(DM_VERSION_CMD),
        c!(DM_REMOVE_ALL_CMD),
        c!(DM_LIST_DEVICES_CMD),
        c!(DM_DEV_CREATE_CMD),
        c!(DM_DEV_REMOVE_CMD),
        c!(DM_DEV_RENAME_CMD),
        c!(DM_DEV_SUSPEND_CMD),
        c!(DM_DEV_STATUS_CMD),
        c!(DM_DEV_WAIT_CMD),
        c!(DM_TABLE_LOAD_CMD),
        c!(DM_TABLE_CLEAR_CMD),
        c!(DM_TABLE_DEPS_CMD),
        c!(DM_TABLE_STATUS_CMD),
        c!(DM_LIST_VERSIONS_CMD),
        c!(DM_TARGET_MSG_CMD),
        c!(DM_DEV_SET_GEOMETRY_CMD),
        c!(DM_DEV_ARM_POLL_CMD),
        c!(DM_GET_TARGET_VERSION_CMD if DM_GET_TARGET_VERSION),
        c!(DM_MPATH_PROBE_PATHS_CMD if DM_MPATH_PROBE_PATHS),
        c!(DM_VERSION),
        c!(DM_REMOVE_ALL),
        c!(DM_LIST_DEVICES),
        c!(DM_DEV_CREATE),
        c!(DM_DEV_REMOVE),
        c!(DM_DEV_RENAME),
        c!(DM_DEV_SUSPEND),
        c!(DM_DEV_STATUS),
        c!(DM_DEV_WAIT),
        c!(DM_TABLE_LOAD),
        c!(DM_TABLE_CLEAR),
        c!(DM_TABLE_DEPS),
        c!(DM_TABLE_STATUS),
        c!(DM_LIST_VERSIONS),
        c!(DM_TARGET_MSG),
        c!(DM_DEV_SET_GEOMETRY),
        c!(DM_DEV_ARM_POLL),
        c!(DM_GET_TARGET_VERSION if DM_GET_TARGET_VERSION),
        c!(DM_MPATH_PROBE_PATHS if DM_MPATH_PROBE_PATHS),
        c!(DM_READONLY_FLAG),
        c!(DM_SUSPEND_FLAG),
        c!(DM_PERSISTENT_DEV_FLAG),
        c!(DM_STATUS_TABLE_FLAG),
        c!(DM_ACTIVE_PRESENT_FLAG),
        c!(DM_INACTIVE_PRESENT_FLAG),
        c!(DM_BUFFER_FULL_FLAG),
        c!(DM_SKIP_BDGET_FLAG),
        c!(DM_SKIP_LOCKFS_FLAG),
        c!(DM_NOFLUSH_FLAG),
        c!(DM_QUERY_INACTIVE_TABLE_FLAG),
        c!(DM_UEVENT_GENERATED_FLAG),
        c!(DM_UUID_FLAG),
        c!(DM_SECURE_DATA_FLAG),
        c!(DM_DATA_OUT_FLAG),
        c!(DM_DEFERRED_REMOVE),
        c!(DM_INTERNAL_SUSPEND_FLAG if DM_INTERNAL_SUSPEND_FLAG),
        c!(DM_IMA_MEASUREMENT_FLAG if DM_IMA_MEASUREMENT_FLAG),
    ]);

    // <libdevmapper.h>, only when libdevmapper-dev is installed.
    v.extend([
        c!(DM_COOKIE_MAGIC if DM_COOKIE_MAGIC),
        c!(DM_UDEV_FLAGS_MASK if DM_UDEV_FLAGS_MASK),
        c!(DM_UDEV_FLAGS_SHIFT if DM_UDEV_FLAGS_SHIFT),
        c!(DM_UDEV_DISABLE_DM_RULES_FLAG if DM_UDEV_DISABLE_DM_RULES_FLAG),
        c!(DM_UDEV_DISABLE_SUBSYSTEM_RULES_FLAG if DM_UDEV_DISABLE_SUBSYSTEM_RULES_FLAG),
        c!(DM_UDEV_DISABLE_DISK_RULES_FLAG if DM_UDEV_DISABLE_DISK_RULES_FLAG),
        c!(DM_UDEV_DISABLE_OTHER_RULES_FLAG if DM_UDEV_DISABLE_OTHER_RULES_FLAG),
        c!(DM_UDEV_LOW_PRIORITY_FLAG if DM_UDEV_LOW_PRIORITY_FLAG),
        c!(DM_UDEV_DISABLE_LIBRARY_FALLBACK if DM_UDEV_DISABLE_LIBRARY_FALLBACK),
        c!(DM_UDEV_PRIMARY_SOURCE_FLAG if DM_UDEV_PRIMARY_SOURCE_FLAG),
        c!(DM_SUBSYSTEM_UDEV_FLAG0 if DM_SUBSYSTEM_UDEV_FLAG0),
        c!(DM_SUBSYSTEM_UDEV_FLAG1 if DM_SUBSYSTEM_UDEV_FLAG1),
        c!(DM_SUBSYSTEM_UDEV_FLAG2 if DM_SUBSYSTEM_UDEV_FLAG2),
        c!(DM_SUBSYSTEM_UDEV_FLAG3 if DM_SUBSYSTEM_UDEV_FLAG3),
        c!(DM_SUBSYSTEM_UDEV_FLAG4 if DM_SUBSYSTEM_UDEV_FLAG4),
        c!(DM_SUBSYSTEM_UDEV_FLAG5 if DM_SUBSYSTEM_UDEV_FLAG5),
        c!(DM_SUBSYSTEM_UDEV_FLAG6 if DM_SUBSYSTEM_UDEV_FLAG6),
        c!(DM_SUBSYSTEM_UDEV_FLAG7 if DM_SUBSYSTEM_UDEV_FLAG7),
    ]);

    // <linux/fs.h>
    v.extend([
        c!(BLKROSET),
        c!(BLKROGET),
        c!(BLKRRPART),
        c!(BLKGETSIZE),
        c!(BLKFLSBUF),
        c!(BLKSSZGET),
        c!(BLKBSZGET),
        c!(BLKGETSIZE64),
        c!(BLKDISCARD),
        c!(BLKIOMIN),
        c!(BLKIOOPT),
        c!(BLKPBSZGET),
        c!(BLKGETDISKSEQ if BLKGETDISKSEQ),
    ]);

    // <linux/loop.h>
    v.push(size!(loop_info64));
    v.extend(
        off!(loop_info64; lo_device, lo_inode, lo_rdevice, lo_offset, lo_sizelimit,
        lo_number, lo_encrypt_type, lo_encrypt_key_size, lo_flags, lo_file_name, lo_crypt_name,
        lo_encrypt_key, lo_init),
    );
    v.push(size!(loop_config if LOOP_CONFIGURE));
    v.extend(off!(loop_config if LOOP_CONFIGURE; fd, block_size, info, __reserved));
    v.extend([
        c!(LO_NAME_SIZE),
        c!(LO_KEY_SIZE),
        c!(LO_FLAGS_READ_ONLY),
        c!(LO_FLAGS_AUTOCLEAR),
        c!(LO_FLAGS_PARTSCAN),
        c!(LO_FLAGS_DIRECT_IO),
        c!(LOOP_SET_STATUS_SETTABLE_FLAGS if LOOP_SET_STATUS_SETTABLE_FLAGS),
        c!(LOOP_SET_STATUS_CLEARABLE_FLAGS if LOOP_SET_STATUS_CLEARABLE_FLAGS),
        c!(LOOP_CONFIGURE_SETTABLE_FLAGS if LOOP_CONFIGURE_SETTABLE_FLAGS),
        c!(LOOP_SET_FD),
        c!(LOOP_CLR_FD),
        c!(LOOP_SET_STATUS),
        c!(LOOP_GET_STATUS),
        c!(LOOP_SET_STATUS64),
        c!(LOOP_GET_STATUS64),
        c!(LOOP_CHANGE_FD),
        c!(LOOP_SET_CAPACITY),
        c!(LOOP_SET_DIRECT_IO if LOOP_SET_DIRECT_IO),
        c!(LOOP_SET_BLOCK_SIZE if LOOP_SET_BLOCK_SIZE),
        c!(LOOP_CONFIGURE if LOOP_CONFIGURE),
        c!(LOOP_CTL_ADD),
        c!(LOOP_CTL_REMOVE),
        c!(LOOP_CTL_GET_FREE),
    ]);

    // <linux/nvme_ioctl.h>
    v.push(size!(nvme_passthru_cmd));
    v.extend(
        off!(nvme_passthru_cmd; opcode, flags, rsvd1, nsid, cdw2, cdw3, metadata, addr,
        metadata_len, data_len, cdw10, cdw11, cdw12, cdw13, cdw14, cdw15, timeout_ms, result),
    );
    v.push(c!(NVME_IOCTL_ADMIN_CMD));

    // <scsi/sg.h>
    v.push(size!(sg_io_hdr));
    v.extend(
        off!(sg_io_hdr; interface_id, dxfer_direction, cmd_len, mx_sb_len, iovec_count,
        dxfer_len, dxferp, cmdp, sbp, timeout, flags, pack_id, usr_ptr, status, masked_status,
        msg_status, sb_len_wr, host_status, driver_status, resid, duration, info),
    );
    v.extend([
        c!(SG_IO),
        c!(SG_DXFER_NONE),
        c!(SG_DXFER_TO_DEV),
        c!(SG_DXFER_FROM_DEV),
        c!(SG_INFO_OK_MASK),
        c!(SG_INFO_OK),
        c!(SG_INFO_CHECK),
    ]);
    // 'S', which the header spells only in a comment.
    v.push(num("'S'", None, SG_INTERFACE_ID_ORIG as u64));

    v.extend(pr_checks());

    // <linux/netlink.h>, <sys/socket.h>
    v.extend([
        c!(AF_NETLINK),
        c!(NETLINK_KOBJECT_UEVENT),
        c!(NETLINK_NO_ENOBUFS),
        c!(SOL_NETLINK),
        c!(SO_PASSCRED),
        c!(SO_RCVBUFFORCE),
        c!(SO_RCVBUF),
    ]);

    v
}

/// `<linux/pr.h>`: the Rust fields named `type_` are C's `type`. The `PR_STS_*` values are an
/// enum (no macro to guard on) in 6.3+ headers only, so they are checked by value in sys/.
fn pr_checks() -> Vec<Check> {
    let mut v = vec![
        size!(pr_registration),
        size!(pr_reservation),
        size!(pr_preempt),
        size!(pr_clear),
        num(
            "offsetof(struct pr_reservation, type)",
            None,
            offset_of!(pr_reservation, type_) as u64,
        ),
        num(
            "offsetof(struct pr_preempt, type)",
            None,
            offset_of!(pr_preempt, type_) as u64,
        ),
    ];
    v.extend(off!(pr_registration; old_key, new_key, flags, __pad));
    v.extend(off!(pr_reservation; key, flags));
    v.extend(off!(pr_preempt; old_key, new_key, flags));
    v.extend(off!(pr_clear; key, flags, __pad));
    v.extend([
        c!(PR_WRITE_EXCLUSIVE),
        c!(PR_EXCLUSIVE_ACCESS),
        c!(PR_WRITE_EXCLUSIVE_REG_ONLY),
        c!(PR_EXCLUSIVE_ACCESS_REG_ONLY),
        c!(PR_WRITE_EXCLUSIVE_ALL_REGS),
        c!(PR_EXCLUSIVE_ACCESS_ALL_REGS),
        c!(PR_FL_IGNORE_KEY),
        c!(IOC_PR_REGISTER),
        c!(IOC_PR_RESERVE),
        c!(IOC_PR_RELEASE),
        c!(IOC_PR_PREEMPT),
        c!(IOC_PR_PREEMPT_ABORT),
        c!(IOC_PR_CLEAR),
    ]);
    v
}

fn c_source(checks: &[Check]) -> String {
    let mut s = String::from(
        "#include <stddef.h>\n\
         #include <stdio.h>\n\
         #include <sys/socket.h>\n\
         #include <linux/types.h>\n\
         #include <linux/dm-ioctl.h>\n\
         #include <linux/fs.h>\n\
         #include <linux/loop.h>\n\
         #include <linux/netlink.h>\n\
         #include <linux/nvme_ioctl.h>\n\
         #include <linux/pr.h>\n\
         #include <scsi/sg.h>\n\
         #if defined(__has_include)\n\
         #if __has_include(<libdevmapper.h>)\n\
         #include <libdevmapper.h>\n\
         #endif\n\
         #endif\n\
         \n\
         int main(void)\n{\n",
    );
    for c in checks {
        let print = match c.rust {
            Val::Num(_) => format!(
                "    printf(\"%s\\t%llu\\n\", \"{e}\", (unsigned long long)({e}));\n",
                e = c.expr
            ),
            Val::Str(_) => format!("    printf(\"%s\\t%s\\n\", \"{e}\", {e});\n", e = c.expr),
        };
        match c.guard {
            Some(g) => {
                let _ = write!(
                    s,
                    "#ifdef {g}\n{print}#else\n    printf(\"%s\\tMISSING\\n\", \"{e}\");\n#endif\n",
                    e = c.expr
                );
            }
            None => s.push_str(&print),
        }
    }
    s.push_str("    return 0;\n}\n");
    s
}

/// A per-process scratch directory, removed on drop (also when the test panics).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("lunkit-sys-c-abi-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `$CC` split on whitespace (so `CC="ccache gcc"` works), default `cc`; then `$CFLAGS`.
fn compiler() -> (String, Vec<String>) {
    let cc = std::env::var("CC").unwrap_or_default();
    let mut words = cc.split_whitespace().map(String::from);
    let prog = words.next().unwrap_or_else(|| "cc".to_string());
    let mut args: Vec<String> = words.collect();
    if let Ok(flags) = std::env::var("CFLAGS") {
        args.extend(flags.split_whitespace().map(String::from));
    }
    (prog, args)
}

fn run_c_program(src: &str) -> String {
    let dir = TempDir::new();
    let c_file = dir.path().join("abi.c");
    let exe = dir.path().join("abi");
    std::fs::write(&c_file, src).expect("write C source");

    let (cc, args) = compiler();
    let out = Command::new(&cc)
        .args(&args)
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&c_file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}\n{INSTALL_HINT}"));
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        panic!(
            "compiling the C ABI probe with `{cc}` failed ({}):\n{stderr}\n\
             If a header is missing: {INSTALL_HINT}",
            out.status
        );
    }

    let run = Command::new(&exe)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    assert!(
        run.status.success(),
        "C ABI probe exited with {}",
        run.status
    );
    String::from_utf8(run.stdout).expect("C ABI probe printed non-UTF-8")
}

#[test]
fn rust_abi_matches_system_c_headers() {
    let checks = checks();
    let output = run_c_program(&c_source(&checks));

    let mut c_values = std::collections::HashMap::new();
    for line in output.lines() {
        let (expr, value) = line
            .split_once('\t')
            .unwrap_or_else(|| panic!("malformed probe line {line:?}"));
        c_values.insert(expr.to_string(), value.to_string());
    }

    let mut mismatches = Vec::new();
    let mut skipped = Vec::new();
    for check in &checks {
        let Some(c) = c_values.get(&check.expr) else {
            mismatches.push(format!("{}: not printed by the C probe", check.expr));
            continue;
        };
        if c == "MISSING" {
            skipped.push(check.expr.as_str());
            continue;
        }
        let rust = match &check.rust {
            Val::Num(n) => n.to_string(),
            Val::Str(s) => (*s).to_string(),
        };
        if *c != rust {
            mismatches.push(format!("{}: C {c}, Rust {rust}", check.expr));
        }
    }

    if !skipped.is_empty() {
        eprintln!(
            "not in the installed headers, not checked: {}",
            skipped.join(", ")
        );
    }
    eprintln!(
        "checked {} of {} items against the C headers",
        checks.len() - skipped.len(),
        checks.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} ABI mismatch(es) between lunkit-sys and the system C headers:\n  {}",
        mismatches.len(),
        mismatches.join("\n  ")
    );
}

#[test]
fn c_source_guards_optional_items() {
    let src = c_source(&[
        num("A", None, 1),
        num("B", Some("B"), 2),
        Check {
            expr: "S".into(),
            guard: None,
            rust: Val::Str("s"),
        },
    ]);
    assert!(src.contains("(unsigned long long)(A)"));
    assert!(src.contains("#ifdef B\n"));
    assert!(src.contains("\"%s\\tMISSING\\n\", \"B\""));
    assert!(src.contains("printf(\"%s\\t%s\\n\", \"S\", S);"));
}
