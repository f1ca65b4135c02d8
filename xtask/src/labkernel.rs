//! The lab's second kernel: Debian 12's 6.12 with NVMe in-band authentication, resolved from
//! the Debian archive rather than pinned to one ABI.
//!
//! Debian gives each 6.12 upload a new ABI in the package name (`linux-image-6.12.117+deb12-amd64`)
//! and drops the old one from bookworm-security when the next comes, so a pinned name stops
//! installing within weeks. [`resolve`] takes the newest `linux-image-6.12.<n>+deb<m>-amd64`
//! that `apt-cache` offers whose kernel config has NVMe host and target authentication
//! (`CONFIG_NVME_HOST_AUTH=y`, `CONFIG_NVME_TARGET_AUTH=y`), read from `/boot/config-<abi>`
//! when the package is installed, else from the package itself (`apt-get download`, the
//! config taken out of its data archive: nothing is installed to look). The choice is
//! printed and recorded in `<target>/lab-auth-kernel`; VM test runs boot the recorded one
//! (the guest is named after it, so every report says which kernel ran), and `cargo xtask
//! provision` resolves again. `LUNKIT_AUTH_KERNEL=<abi>` names one instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Result, paths, process};

/// The label the VM test table ([`crate::vmtests`]) uses for this kernel until it is resolved.
pub const LABEL: &str = "auth-6.12";

/// Names the ABI to boot instead of resolving one (`6.12.117+deb12-amd64`).
pub const ENV: &str = "LUNKIT_AUTH_KERNEL";

/// The series the lab's second kernel is taken from.
const SERIES: &str = "6.12.";

/// Config options the kernel must have built in: the host side of DH-HMAC-CHAP and nvmet's.
const NEEDED: &[&str] = &["CONFIG_NVME_HOST_AUTH=y", "CONFIG_NVME_TARGET_AUTH=y"];

/// Where the resolved ABI is recorded.
fn record() -> PathBuf {
    paths::target_dir().join("lab-auth-kernel")
}

/// The ABI VM tests boot: [`ENV`], else the recorded one, else one [`resolve`]d now.
pub fn chosen() -> Result<String> {
    if let Some(abi) = std::env::var(ENV).ok().filter(|v| !v.trim().is_empty()) {
        return Ok(abi.trim().to_owned());
    }
    if let Ok(text) = std::fs::read_to_string(record()) {
        let abi = text.trim();
        if !abi.is_empty() {
            return Ok(abi.to_owned());
        }
    }
    resolve()
}

/// Resolves the newest qualifying 6.12 ABI the archive offers, prints it and records it.
pub fn resolve() -> Result<String> {
    if let Some(abi) = std::env::var(ENV).ok().filter(|v| !v.trim().is_empty()) {
        eprintln!("xtask: lab auth kernel {} ({ENV})", abi.trim());
        return Ok(abi.trim().to_owned());
    }
    let out = Command::new("apt-cache")
        .args([
            "search",
            "--names-only",
            r"^linux-image-6\.12\.[0-9]+\+deb[0-9]+-amd64$",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| {
            format!("cannot run apt-cache (the lab's 6.12 kernel comes from Debian's archive): {e}")
        })?;
    if !out.status.success() {
        return Err(format!(
            "`apt-cache search linux-image-6.12…` failed ({})",
            out.status
        )
        .into());
    }
    let listing = String::from_utf8_lossy(&out.stdout);
    let abi = pick(&listing, has_auth)?;
    eprintln!(
        "xtask: lab auth kernel {abi}: the newest 6.12 the archive offers with NVMe authentication"
    );
    let file = record();
    std::fs::write(&file, format!("{abi}\n")).map_err(|e| {
        format!(
            "cannot record the lab auth kernel in {}: {e}",
            file.display()
        )
    })?;
    Ok(abi)
}

/// The ABIs of an `apt-cache search` listing's `linux-image-6.12.<n>+deb<m>-amd64` packages
/// (not `-unsigned`, `-dbg`, `cloud` or `rt`), newest first.
pub fn candidates(listing: &str) -> Vec<String> {
    let mut abis: Vec<String> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.strip_prefix("linux-image-"))
        .filter(|abi| {
            abi.strip_prefix(SERIES)
                .and_then(|rest| rest.strip_suffix("-amd64"))
                .and_then(|rest| rest.split_once("+deb"))
                .is_some_and(|(patch, deb)| {
                    !patch.is_empty()
                        && patch.bytes().all(|b| b.is_ascii_digit())
                        && !deb.is_empty()
                        && deb.bytes().all(|b| b.is_ascii_digit())
                })
        })
        .map(str::to_owned)
        .collect();
    abis.sort_by_key(|abi| std::cmp::Reverse(crate::provision::version_key(abi)));
    abis.dedup();
    abis
}

/// The newest of `listing`'s [`candidates`] that `qualifies`; an error naming what was
/// looked at when none does.
pub fn pick(listing: &str, mut qualifies: impl FnMut(&str) -> Result<bool>) -> Result<String> {
    let all = candidates(listing);
    if all.is_empty() {
        return Err(format!(
            "the Debian archive offers no linux-image-{SERIES}<n>+deb<m>-amd64 package (the lab's \
             second kernel, for the NVMe authentication tests): run `apt-get update`, and check \
             that bookworm-security (or another source of Debian's 6.12) is in the apt sources; \
             or set {ENV}=<abi> to an installed one"
        )
        .into());
    }
    let mut refused = Vec::new();
    for abi in &all {
        if qualifies(abi)? {
            return Ok(abi.clone());
        }
        refused.push(abi.as_str());
    }
    Err(format!(
        "none of the 6.12 kernels the archive offers ({}) is built with {}: the NVMe \
         authentication tests need both; set {ENV}=<abi> to a kernel that has them",
        refused.join(", "),
        NEEDED.join(" and ")
    )
    .into())
}

/// Whether a kernel config has every option of [`NEEDED`].
pub fn config_has_auth(config: &str) -> bool {
    NEEDED
        .iter()
        .all(|want| config.lines().any(|l| l.trim() == *want))
}

/// Whether `abi`'s kernel config has NVMe authentication: the installed `/boot/config-<abi>`,
/// else the one in the package, downloaded to `<target>/lab-kernel-debs/`.
fn has_auth(abi: &str) -> Result<bool> {
    let installed = Path::new("/boot").join(format!("config-{abi}"));
    if let Ok(text) = std::fs::read_to_string(&installed) {
        return Ok(config_has_auth(&text));
    }
    let dir = paths::target_dir().join("lab-kernel-debs");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let package = format!("linux-image-{abi}");
    eprintln!("xtask: downloading {package} to read its kernel config");
    process::run(
        Command::new("apt-get")
            .arg("download")
            .arg(&package)
            .current_dir(&dir),
    )?;
    let deb = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
        })
        .ok_or_else(|| {
            format!(
                "apt-get download {package} left no .deb in {}",
                dir.display()
            )
        })?;
    let config = config_in_deb(&deb, abi)?;
    let _ = std::fs::remove_file(&deb);
    Ok(config_has_auth(&config))
}

/// `./boot/config-<abi>` out of a kernel package's data archive.
fn config_in_deb(deb: &Path, abi: &str) -> Result<String> {
    let mut data = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run dpkg-deb: {e}"))?;
    let stdout = data.stdout.take().ok_or("dpkg-deb gave no stdout")?;
    let out = Command::new("tar")
        .args(["-xOf", "-"])
        .arg(format!("./boot/config-{abi}"))
        .stdin(stdout)
        .output()
        .map_err(|e| format!("cannot run tar: {e}"));
    let status = data.wait().map_err(|e| format!("dpkg-deb: {e}"))?;
    let out = out?;
    if !status.success() || !out.status.success() {
        return Err(format!("{} holds no boot/config-{abi}", deb.display()).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines of `apt-cache search --names-only '^linux-image-6\.12'` on bookworm with
    /// bookworm-security, December 2026 (`-unsigned`, `-dbg`, cloud and rt flavours among
    /// them, which are not taken), with a 6.1 and an old 6.12.9 added: 9 must sort below 111.
    const LISTING: &str = "\
linux-image-6.12-amd64-dbg - Debugging symbols for Linux amd64 configuration (meta-package)
linux-image-6.12.107+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.111+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.113+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.113+deb12-cloud-amd64 - Linux 6.12 for x86-64 cloud (signed)
linux-image-6.12.117+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.117+deb12-amd64-dbg - Debug symbols for linux-image-6.12.117+deb12-amd64
linux-image-6.12.117+deb12-rt-amd64 - Linux 6.12 for 64-bit PCs, PREEMPT_RT (signed)
linux-image-6.12.118+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.118+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.1.0-57-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.12.9+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
";

    #[test]
    fn the_candidates_are_the_plain_amd64_images_newest_first() {
        assert_eq!(
            candidates(LISTING),
            [
                "6.12.118+deb12-amd64",
                "6.12.117+deb12-amd64",
                "6.12.113+deb12-amd64",
                "6.12.111+deb12-amd64",
                "6.12.9+deb12-amd64"
            ]
        );
    }

    #[test]
    fn the_newest_with_authentication_is_taken() {
        assert_eq!(pick(LISTING, |_| Ok(true)).unwrap(), "6.12.118+deb12-amd64");
        // The newest built without it is passed over for the next.
        let got = pick(LISTING, |abi| Ok(abi != "6.12.118+deb12-amd64")).unwrap();
        assert_eq!(got, "6.12.117+deb12-amd64");
    }

    #[test]
    fn none_qualifying_or_none_offered_is_an_error_saying_what_to_do() {
        let e = pick(LISTING, |_| Ok(false)).unwrap_err().to_string();
        assert!(
            e.contains("6.12.118+deb12-amd64, 6.12.117+deb12-amd64"),
            "{e}"
        );
        assert!(e.contains("CONFIG_NVME_TARGET_AUTH=y"), "{e}");
        let e = pick("linux-image-6.1.0-57-amd64 - Linux 6.1\n", |_| Ok(true))
            .unwrap_err()
            .to_string();
        assert!(e.contains("apt-get update"), "{e}");
        assert!(e.contains(ENV), "{e}");
    }

    #[test]
    fn a_config_needs_host_and_target_authentication_built_in() {
        let both = "CONFIG_NVME_AUTH=m\nCONFIG_NVME_HOST_AUTH=y\nCONFIG_NVME_TARGET_AUTH=y\n";
        assert!(config_has_auth(both));
        // Debian's 6.1.
        let none = "# CONFIG_NVME_AUTH is not set\n# CONFIG_NVME_TARGET_AUTH is not set\n";
        assert!(!config_has_auth(none));
        assert!(!config_has_auth("CONFIG_NVME_HOST_AUTH=y\n"));
    }
}
