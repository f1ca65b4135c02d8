//! Provisioning the lab: Debian packages for QEMU, the guest kernel and the peers, and
//! virtme-ng from PyPI in a venv under target/. As root on Debian we install what is missing;
//! otherwise we say exactly what to install and stop.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Result, paths, process};

/// Debian packages the lab needs (docs/DESIGN.md, "Testing"), always installed together.
pub const APT_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "linux-image-amd64",
    "kmod",
    "open-iscsi",
    "multipath-tools",
    "sg3-utils",
    "udev",
    "lsscsi",
    "busybox-static",
    // The peer of the NVMe/TCP bench rows (`nvme connect`, `nvme disconnect`); no test uses
    // it. Its install writes /etc/nvme/hostnqn and hostid, as on any node that has it.
    "nvme-cli",
    // tc (netem) for the link-loss detach test.
    "iproute2",
    // Debian's python3 makes no venv (no ensurepip) without it; virtme-ng lives in a venv.
    "python3-venv",
    // lunkit-sys's ABI test compiles C against <linux/dm-ioctl.h> and <linux/fs.h>.
    "gcc",
    "linux-libc-dev",
];

/// The guest's vCPUs: two, like a small node, so that work side by side really overlaps.
pub const DEFAULT_CPUS: u8 = 2;

/// Sets the default kernel's vCPUs instead of [`DEFAULT_CPUS`] (1 to 4), for measuring what
/// the guest's size costs the suite.
pub const CPUS_ENV: &str = "LUNKIT_VM_CPUS";

/// [`CPUS_ENV`], or [`DEFAULT_CPUS`] when it is not set.
fn default_cpus() -> Result<u8> {
    match std::env::var(CPUS_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_CPUS),
        Ok(v) => v
            .parse::<u8>()
            .ok()
            .filter(|n| (1..=4).contains(n))
            .ok_or_else(|| format!("{CPUS_ENV}={v:?}: expected 1 to 4").into()),
        Err(e) => Err(format!("{CPUS_ENV}: {e}").into()),
    }
}

/// virtme-ng from PyPI, pinned: its command line and guest init are what we tested.
pub const VIRTME_NG: &str = "virtme-ng";
pub const VIRTME_NG_VERSION: &str = "1.42";

/// A program each package must provide (found on PATH or in the sbin directories).
const PROGRAMS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("modprobe", "kmod"),
    ("iscsiadm", "open-iscsi"),
    ("iscsid", "open-iscsi"),
    ("multipath", "multipath-tools"),
    ("multipathd", "multipath-tools"),
    ("sg_inq", "sg3-utils"),
    ("udevadm", "udev"),
    ("lsscsi", "lsscsi"),
    ("busybox", "busybox-static"),
    ("tc", "iproute2"),
    ("nvme", "nvme-cli"),
    ("gcc", "gcc"),
];

/// What the VM needs, resolved.
#[derive(Debug, Clone)]
pub struct Lab {
    /// `/boot/vmlinuz-<version>`, the newest one with modules.
    pub kernel: PathBuf,
    pub kernel_version: String,
    /// The guest's vCPUs ([`DEFAULT_CPUS`] but for a kernel that needs fewer).
    pub cpus: u8,
    /// The venv's `bin/` (holds `vng` and `virtme-run`).
    pub venv_bin: PathBuf,
}

/// Makes sure everything is there, installing it when we may.
pub fn ensure() -> Result<Lab> {
    let missing = missing_packages();
    let kernel = newest_kernel();
    if !missing.is_empty() || kernel.is_none() {
        let mut want = missing.clone();
        if kernel.is_none() && !want.contains(&"linux-image-amd64") {
            want.push("linux-image-amd64");
        }
        if !may_install() {
            return Err(format!(
                "the QEMU lab needs packages that are missing ({}). As root on Debian, run:\n  \
                 apt-get update && apt-get install -y {}",
                want.join(", "),
                APT_PACKAGES.join(" ")
            )
            .into());
        }
        eprintln!("xtask: installing {} with apt-get", want.join(", "));
        apt_install(APT_PACKAGES)?;
        let still = missing_packages();
        if !still.is_empty() {
            return Err(
                format!("still missing after apt-get install: {}", still.join(", ")).into(),
            );
        }
    }
    let (kernel, kernel_version) =
        newest_kernel().ok_or("no /boot/vmlinuz-<version> with /lib/modules/<version>")?;
    let venv_bin = ensure_venv()?;
    Ok(Lab {
        kernel,
        kernel_version,
        cpus: default_cpus()?,
        venv_bin,
    })
}

/// `lab` booting kernel `version` with `cpus` vCPUs instead, installing
/// `linux-image-<version>` when it is missing or broken and we may.
///
/// The kernel's image is installed as `/boot/lunkit-lab-vmlinuz-<version>` (a `dpkg-divert`
/// made before the install): under its own name no lookup for `/boot/vmlinuz-*` takes it,
/// neither [`newest_kernel`] nor the host's boot loader. Without an initramfs
/// (`INITRD=No`): virtme-ng boots without one, and making it takes minutes.
pub fn with_kernel(lab: &Lab, version: &str, cpus: u8) -> Result<Lab> {
    let kernel = PathBuf::from(format!("/boot/lunkit-lab-vmlinuz-{version}"));
    if let Some(why) = kernel_unready(&kernel, version) {
        let package = format!("linux-image-{version}");
        if !may_install() {
            return Err(format!(
                "VM tests ask for kernel {version}, which is not ready ({why}). As root on \
                 Debian, run:\n  dpkg-divert --package lunkit-lab --add --rename --divert {} \
                 /boot/vmlinuz-{version}\n  apt-get update && apt-get install -y --reinstall \
                 {package}",
                kernel.display()
            )
            .into());
        }
        eprintln!(
            "xtask: kernel {version} is not ready ({why}): installing {package} with apt-get, \
             its image as {}",
            kernel.display()
        );
        // Idempotent: an existing identical diversion is left as it is, and `--rename` moves
        // an image a by-hand install left under the usual name.
        process::run(
            Command::new("dpkg-divert")
                .args(["--package", "lunkit-lab", "--add", "--rename", "--divert"])
                .arg(&kernel)
                .arg(format!("/boot/vmlinuz-{version}")),
        )?;
        process::run(Command::new("apt-get").arg("update"))?;
        // `--reinstall`: a package dpkg calls installed may still have lost its files (a
        // modules tree emptied by hand, an image deleted); a missing one is just installed.
        process::run(
            Command::new("apt-get")
                .args(["install", "-y", "--reinstall", "--no-install-recommends"])
                .arg(&package)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .env("INITRD", "No"),
        )?;
        if let Some(why) = kernel_unready(&kernel, version) {
            return Err(format!("{package} installed, but {why}").into());
        }
    }
    // Says in the log what this run found, for a guest that later fails to boot.
    eprintln!(
        "xtask: kernel {version}: {} and {} modules",
        kernel.display(),
        module_count(version)
    );
    Ok(Lab {
        kernel,
        kernel_version: version.to_owned(),
        cpus,
        venv_bin: lab.venv_bin.clone(),
    })
}

/// What keeps the guest from booting `kernel` (version `version`), or `None`.
///
/// Without its modules the guest cannot mount its root: virtme-ng builds the guest's
/// initramfs from `/lib/modules/<version>` (virtio, 9p, overlayfs), and a guest without them
/// panics in a few seconds and exits 255 having printed nothing. A directory is not enough:
/// an emptied one, or one holding only what `depmod` wrote, passes `is_dir`. So every module
/// `modules.dep` lists must be there (a few thousand `stat`s, milliseconds).
pub fn kernel_unready(kernel: &Path, version: &str) -> Option<String> {
    if !kernel.is_file() {
        return Some(format!("{} is missing", kernel.display()));
    }
    let modules = Path::new("/lib/modules").join(version);
    let dep = modules.join("modules.dep");
    let text = match std::fs::read_to_string(&dep) {
        Ok(t) => t,
        Err(e) => return Some(format!("cannot read {}: {e}", dep.display())),
    };
    let listed: Vec<&str> = text.lines().filter_map(|l| l.split(':').next()).collect();
    if listed.is_empty() {
        return Some(format!("{} lists no module", dep.display()));
    }
    if let Some(gone) = listed.iter().find(|m| !modules.join(m).is_file()) {
        return Some(format!("{} lists {gone}, which is missing", dep.display()));
    }
    None
}

/// How many modules `version`'s `modules.dep` lists (0 when unreadable).
pub fn module_count(version: &str) -> usize {
    let dep = Path::new("/lib/modules").join(version).join("modules.dep");
    std::fs::read_to_string(dep).map_or(0, |t| t.lines().count())
}

/// Whether this process may install Debian packages: root on Debian.
pub fn may_install() -> bool {
    is_root() && is_debian()
}

/// `apt-get update`, then `apt-get install -y --no-install-recommends PACKAGES`.
pub fn apt_install(packages: &[&str]) -> Result<()> {
    apt(packages, false)
}

/// [`apt_install`] with the packages' recommendations too: the set the tool was tested with
/// (mmdebstrap's recommended helpers, a runtime for podman).
pub fn apt_install_recommended(packages: &[&str]) -> Result<()> {
    apt(packages, true)
}

fn apt(packages: &[&str], recommends: bool) -> Result<()> {
    process::run(Command::new("apt-get").arg("update"))?;
    let mut install = Command::new("apt-get");
    install.args(["install", "-y"]);
    if !recommends {
        install.arg("--no-install-recommends");
    }
    process::run(
        install
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn missing_packages() -> Vec<&'static str> {
    let mut v: Vec<&str> = PROGRAMS
        .iter()
        .filter(|(p, _)| find_program(p).is_none())
        .map(|&(_, pkg)| pkg)
        .collect();
    v.dedup();
    if !python_makes_venvs() {
        v.push("python3-venv");
    }
    if !Path::new("/usr/include/linux/dm-ioctl.h").is_file() {
        v.push("linux-libc-dev");
    }
    v
}

/// `python3 -m venv` needs the venv and ensurepip modules (python3-venv on Debian).
fn python_makes_venvs() -> bool {
    Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Looks on PATH and in the sbin directories (not on a normal user's PATH).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    // Effective uid from /proc (std has no geteuid): "Uid:\treal\teffective\t...".
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|u| u.split_whitespace().nth(1))
            == Some("0")
    })
}

fn is_debian() -> bool {
    Path::new("/etc/debian_version").exists()
}

/// The newest `/boot/vmlinuz-<version>` whose modules are installed (the guest loads
/// scsi_debug, dm_multipath, iscsi_tcp and LIO from /lib/modules through the shared root),
/// other than a lab kernel [`with_kernel`] installed (the 6.12 of [`crate::labkernel`], never
/// the default kernel however new); `LUNKIT_VM_KERNEL` names one instead.
pub fn newest_kernel() -> Option<(PathBuf, String)> {
    if let Some(k) = std::env::var_os("LUNKIT_VM_KERNEL") {
        let k = PathBuf::from(k);
        let version = k
            .file_name()?
            .to_str()?
            .strip_prefix("vmlinuz-")?
            .to_owned();
        return Some((k, version));
    }
    let mut versions: Vec<String> = std::fs::read_dir("/boot")
        .ok()?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("vmlinuz-")
                .map(str::to_owned)
        })
        .filter(|v| {
            Path::new("/lib/modules").join(v).is_dir()
                && !Path::new(&format!("/boot/lunkit-lab-vmlinuz-{v}")).exists()
        })
        .collect();
    versions.sort_by_key(|v| version_key(v));
    let v = versions.pop()?;
    Some((PathBuf::from(format!("/boot/vmlinuz-{v}")), v))
}

/// `6.1.0-56-amd64` sorts by its numbers, so 6.10 comes after 6.9.
pub fn version_key(v: &str) -> Vec<(u64, String)> {
    v.split(['.', '-', '+', '~'])
        .map(|part| match part.parse() {
            Ok(n) => (n, String::new()),
            Err(_) => (0, part.to_owned()),
        })
        .collect()
}

/// virtme-ng in `target/vng-venv`, at the pinned version.
fn ensure_venv() -> Result<PathBuf> {
    let venv = paths::venv();
    let bin = venv.join("bin");
    if bin.join("vng").is_file() && has_pinned_virtme_ng(&venv) {
        return Ok(bin);
    }
    let python = find_program("python3").ok_or(
        "python3 is missing: install python3 and python3-venv (Debian), then run `cargo xtask provision`",
    )?;
    if !bin.join("pip").is_file() {
        eprintln!("xtask: creating {}", venv.display());
        process::run(Command::new(&python).args(["-m", "venv"]).arg(&venv)).map_err(|e| {
            format!(
                "{e}\n(on Debian, `apt-get install -y python3-venv` provides `python3 -m venv`)"
            )
        })?;
    }
    let spec = format!("{VIRTME_NG}=={VIRTME_NG_VERSION}");
    eprintln!("xtask: pip install {spec} into {}", venv.display());
    process::run(Command::new(bin.join("pip")).args(["install", "--quiet", &spec]))?;
    if !bin.join("vng").is_file() {
        return Err(format!(
            "{spec} installed but {} is missing",
            bin.join("vng").display()
        )
        .into());
    }
    Ok(bin)
}

fn has_pinned_virtme_ng(venv: &Path) -> bool {
    let Ok(lib) = std::fs::read_dir(venv.join("lib")) else {
        return false;
    };
    let dist = format!("virtme_ng-{VIRTME_NG_VERSION}.dist-info");
    lib.flatten()
        .any(|py| py.path().join("site-packages").join(&dist).is_dir())
}

#[cfg(test)]
mod tests {
    use super::version_key;

    #[test]
    fn kernel_versions_sort_numerically() {
        let mut v = vec![
            "6.10.0-1-amd64",
            "6.1.0-56-amd64",
            "6.9.0-2-amd64",
            "6.1.0-9-amd64",
        ];
        v.sort_by_key(|a| version_key(a));
        assert_eq!(
            v,
            [
                "6.1.0-9-amd64",
                "6.1.0-56-amd64",
                "6.9.0-2-amd64",
                "6.10.0-1-amd64"
            ]
        );
    }
}
