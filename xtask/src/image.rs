//! `cargo xtask image`: the lunkit-csi node plugin's OCI image, built from Debian's packages
//! with Debian's tools and nothing from a container registry (csi/README, "The image").
//!
//! 1. The plugin and the `lunkit` CLI, built by cargo (release by default).
//! 2. A root filesystem: bookworm's Essential set plus the pinned packages of `image/packages`,
//!    made by mmdebstrap from Debian's mirror. Cached in `target/image/` until the pins change.
//! 3. The image, by buildah from `image/Containerfile` (`FROM scratch`, the rootfs, the
//!    binaries, the iscsiadm wrapper), in a storage under `target/image/` (never the host's
//!    `/var/lib/containers`), written out as an OCI archive.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::{Result, paths, process, provision};

const USAGE: &str = "\
usage: cargo xtask image [--profile PROFILE] [--out FILE]

  Builds the lunkit-csi image (image/Containerfile) into an OCI archive, by default
  target/image/lunkit-csi.oci.tar, tagged lunkit-csi:<version>-g<commit>. PROFILE is
  cargo's (release unless given; dev for a quick local build).";

/// Debian's suites the rootfs comes from, bookworm's security and point updates included
/// (the pins name versions from them).
const SOURCES: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];

/// What the plugin runs (csi/src/exec.rs) and the wrapper needs (`chroot`), which the rootfs
/// must hold: a pin that stops providing one fails the build, not a stage on a node.
const PROGRAMS: &[&str] = &[
    "usr/sbin/blkid",
    "usr/sbin/mkfs.ext4",
    "usr/sbin/resize2fs",
    "usr/sbin/mkfs.xfs",
    "usr/sbin/xfs_growfs",
    "usr/sbin/chroot",
];

/// The Debian packages this command runs, installed with apt-get as root on Debian.
const TOOLS: &[(&str, &str)] = &[
    ("mmdebstrap", "mmdebstrap"),
    ("buildah", "buildah"),
    ("podman", "podman"),
];

/// The image's name in [`store_dir`], whatever its version: what the VM tests run.
pub const LAB_TAG: &str = "localhost/lunkit-csi:lab";

pub fn main(args: &[String]) -> Result<u8> {
    let mut profile = "release".to_owned();
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--profile" => profile = it.next().ok_or(USAGE)?.clone(),
            "--out" => out = Some(PathBuf::from(it.next().ok_or(USAGE)?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(0);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}").into()),
        }
    }
    let out = out.unwrap_or_else(|| dir().join("lunkit-csi.oci.tar"));
    let built = build(&profile, &out)?;
    println!("{built}");
    Ok(0)
}

/// What [`build`] made.
#[derive(Debug)]
pub struct Built {
    pub archive: PathBuf,
    pub tag: String,
    /// Seconds per phase: binaries, rootfs (near 0 when cached), image, check, store.
    pub phases: [(&'static str, f64); 5],
}

impl std::fmt::Display for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = fs::metadata(&self.archive).map_or(0, |m| m.len());
        write!(
            f,
            "xtask image: {} ({}, {:.1} MiB);",
            self.archive.display(),
            self.tag,
            size as f64 / f64::from(1 << 20)
        )?;
        for (what, secs) in &self.phases {
            write!(f, " {what} {secs:.1} s")?;
        }
        Ok(())
    }
}

/// Where the image's work files live.
fn dir() -> PathBuf {
    paths::target_dir().join("image")
}

/// podman's image store (overlay) holding the last image built, as [`LAB_TAG`]: the VM
/// tests' guest reads it as an additional, read-only image store, so that no test pays for
/// unpacking the image under TCG.
pub fn store_dir() -> PathBuf {
    dir().join("store")
}

/// Builds the image into the OCI archive `out`.
pub fn build(profile: &str, out: &Path) -> Result<Built> {
    ensure_tools()?;
    fs::create_dir_all(dir())?;
    let t = Instant::now();
    let bins = binaries(profile)?;
    let binaries_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let rootfs = rootfs()?;
    let rootfs_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let tag = tag()?;
    assemble(&rootfs, &bins, &tag, out)?;
    let image_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    check(out)?;
    let check_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    store(out)?;
    Ok(Built {
        archive: out.to_path_buf(),
        tag,
        phases: [
            ("binaries", binaries_s),
            ("rootfs", rootfs_s),
            ("image", image_s),
            ("check", check_s),
            ("store", t.elapsed().as_secs_f64()),
        ],
    })
}

/// Installs mmdebstrap and buildah when missing (root on Debian), or says what to install.
fn ensure_tools() -> Result<()> {
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(p, _)| provision::find_program(p).is_none())
        .map(|&(_, pkg)| pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !provision::may_install() {
        return Err(format!(
            "the image needs {}: as root on Debian, apt-get install -y {}",
            missing.join(", "),
            missing.join(" ")
        )
        .into());
    }
    eprintln!(
        "xtask image: installing {} with apt-get",
        missing.join(", ")
    );
    provision::apt_install_recommended(&missing)
}

/// Builds `lunkit-csi` and `lunkit` with `profile`; their paths.
fn binaries(profile: &str) -> Result<[PathBuf; 2]> {
    process::run(process::cargo().args([
        "build",
        "--locked",
        "--profile",
        profile,
        "-p",
        "lunkit-csi",
        "-p",
        "lunkit-cli",
    ]))?;
    // cargo's directory for the dev profile is `debug`.
    let sub = if profile == "dev" { "debug" } else { profile };
    let dir = paths::target_dir().join(sub);
    Ok([dir.join("lunkit-csi"), dir.join("lunkit")])
}

/// `target/image/rootfs.tar`, made again when `image/packages` differs from the copy kept
/// beside it at the last build.
fn rootfs() -> Result<PathBuf> {
    let pins_file = paths::root().join("image/packages");
    let pins_text = fs::read_to_string(&pins_file)?;
    let tar = dir().join("rootfs.tar");
    let key = dir().join("rootfs.packages");
    if tar.is_file() && fs::read_to_string(&key).ok().as_deref() == Some(pins_text.as_str()) {
        eprintln!("xtask image: {} is current", tar.display());
        return Ok(tar);
    }
    let pins = parse_pins(&pins_text)?;
    let _ = fs::remove_file(&key);
    let partial = dir().join("rootfs.tar.partial");
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(["--variant=essential", "--mode=root", "--format=tar"])
        .arg(format!("--include={}", pins.join(",")))
        // Documentation, manuals and translations are of no use in the image.
        .args(["--dpkgopt=path-exclude=/usr/share/man/*"])
        .args(["--dpkgopt=path-exclude=/usr/share/doc/*"])
        .args(["--dpkgopt=path-exclude=/usr/share/locale/*"])
        .args(["--dpkgopt=path-exclude=/usr/share/info/*"])
        .args(["bookworm"])
        .arg(&partial)
        .args(SOURCES)
        .env("SOURCE_DATE_EPOCH", commit_time()?);
    process::run(&mut cmd)?;
    check_programs(&partial)?;
    fs::rename(&partial, &tar)?;
    fs::write(&key, pins_text)?;
    Ok(tar)
}

/// The `name=version` lines of `image/packages` (comments and blank lines skipped); an entry
/// without a version is an error: every package is pinned.
pub fn parse_pins(text: &str) -> Result<Vec<String>> {
    let mut pins = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let ok = line.split_once('=').is_some_and(|(name, version)| {
            !name.is_empty()
                && !version.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
                && version
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.~:".contains(&b))
        });
        if !ok {
            return Err(format!(
                "image/packages line {}: {line:?} is not NAME=VERSION (every package is pinned)",
                n + 1
            )
            .into());
        }
        pins.push(line.to_owned());
    }
    if pins.is_empty() {
        return Err("image/packages names no package".into());
    }
    Ok(pins)
}

/// Fails unless the rootfs tarball holds every program of [`PROGRAMS`].
fn check_programs(tar: &Path) -> Result<()> {
    let listing = Command::new("tar").arg("-tf").arg(tar).output()?;
    let names = String::from_utf8_lossy(&listing.stdout);
    let have: std::collections::HashSet<&str> =
        names.lines().map(|l| l.trim_start_matches("./")).collect();
    let missing: Vec<&str> = PROGRAMS
        .iter()
        .filter(|p| !have.contains(*p))
        .copied()
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the rootfs lacks {} (image/packages no longer provides them)",
            missing.join(", ")
        )
        .into())
    }
}

/// `lunkit-csi:<version>-g<commit>`.
fn tag() -> Result<String> {
    let manifest = fs::read_to_string(paths::root().join("csi/Cargo.toml"))?;
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .ok_or("no version in csi/Cargo.toml")?;
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    Ok(format!("lunkit-csi:{version}-g{commit}"))
}

/// The last commit's time, in seconds since the epoch: every file's time in the image, so
/// that the same commit and pins give the same layers.
fn commit_time() -> Result<String> {
    git(&["log", "-1", "--format=%ct"])
}

fn git(args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(paths::root())
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// buildah with its storage under `target/image/`.
fn buildah() -> Command {
    let mut c = Command::new("buildah");
    c.arg("--root")
        .arg(dir().join("storage"))
        .arg("--runroot")
        .arg(dir().join("run"))
        .args(["--storage-driver", "vfs"]);
    c
}

/// The build context (the Containerfile, the rootfs, the binaries, the wrapper), then the
/// image, pushed into the OCI archive `out` and removed from buildah's storage.
fn assemble(rootfs: &Path, bins: &[PathBuf; 2], tag: &str, out: &Path) -> Result<()> {
    let ctx = dir().join("context");
    let _ = fs::remove_dir_all(&ctx);
    fs::create_dir_all(&ctx)?;
    let image = paths::root().join("image");
    for f in ["Containerfile", "iscsiadm"] {
        fs::copy(image.join(f), ctx.join(f))?;
    }
    // A hard link: the rootfs is a few hundred MiB.
    fs::hard_link(rootfs, ctx.join("rootfs.tar"))
        .or_else(|_| fs::copy(rootfs, ctx.join("rootfs.tar")).map(drop))?;
    for b in bins {
        let name = b.file_name().ok_or("a binary without a name")?;
        fs::copy(b, ctx.join(name))?;
    }
    let name = format!("localhost/{tag}");
    let epoch = commit_time()?;
    let revision = git(&["rev-parse", "HEAD"])?;
    process::run(
        buildah()
            .args(["build", "--format", "oci", "--timestamp", &epoch])
            .args([
                "--label",
                &format!("org.opencontainers.image.revision={revision}"),
            ])
            .args(["--label", "org.opencontainers.image.title=lunkit-csi"])
            .args(["-f", "Containerfile", "-t", &name])
            .arg(&ctx),
    )?;
    let _ = fs::remove_file(out);
    let pushed = process::run(
        buildah()
            .args(["push", &name])
            .arg(format!("oci-archive:{}:{tag}", out.display())),
    );
    let removed = process::run(buildah().args(["rmi", "-f", &name]));
    fs::remove_dir_all(&ctx)?;
    pushed?;
    removed
}

/// Loads the archive into [`store_dir`] as [`LAB_TAG`], replacing what the store held.
fn store(archive: &Path) -> Result<()> {
    let podman = || {
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(store_dir())
            .arg("--runroot")
            .arg(dir().join("podman-run"))
            .args(["--storage-driver", "overlay"]);
        c
    };
    // A new store each time: nothing of an older image or podman configuration is left.
    for d in [store_dir(), dir().join("podman-run")] {
        if d.exists() {
            fs::remove_dir_all(&d)?;
        }
    }
    let out = podman().arg("load").arg("-i").arg(archive).output()?;
    let loaded = String::from_utf8_lossy(&out.stdout);
    let name = loaded
        .lines()
        .find_map(|l| l.strip_prefix("Loaded image: "))
        .ok_or_else(|| {
            format!(
                "podman load printed no image: {loaded}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    process::run(podman().args(["tag", name.trim(), LAB_TAG]))
}

/// Checks the archive as a runtime would see it: its manifest's layers unpacked in order
/// into `target/image/check`, the config's entrypoint the plugin, and in a chroot there the
/// plugin, the CLI and the programs the plugin runs start (their libraries are in the image).
fn check(archive: &Path) -> Result<()> {
    let oci = dir().join("check-oci");
    let rootfs = dir().join("check");
    for d in [&oci, &rootfs] {
        let _ = fs::remove_dir_all(d);
        fs::create_dir_all(d)?;
    }
    process::run(
        Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&oci),
    )?;
    let blob = |digest: &str| oci.join("blobs/sha256").join(digest);
    let index = fs::read_to_string(oci.join("index.json"))?;
    let manifest = fs::read_to_string(blob(
        digests(&index)
            .first()
            .ok_or("index.json names no manifest")?,
    ))?;
    let (config, layers) = manifest
        .split_once("\"layers\"")
        .ok_or("the manifest has no layers")?;
    let config = fs::read_to_string(blob(
        digests(config)
            .first()
            .ok_or("the manifest names no config")?,
    ))?;
    if !config.contains("\"Entrypoint\":[\"/usr/local/bin/lunkit-csi\"]") {
        return Err(format!("the image's entrypoint is not the plugin: {config}").into());
    }
    for layer in digests(layers) {
        process::run(
            Command::new("tar")
                .arg("-xf")
                .arg(blob(layer))
                .arg("-C")
                .arg(&rootfs),
        )?;
    }
    let programs = PROGRAMS
        .iter()
        .map(|p| format!("/{p}"))
        .collect::<Vec<_>>()
        .join(" ");
    let script = format!(
        "set -e; /usr/local/bin/lunkit-csi --version; /usr/local/bin/lunkit --version; \
         for p in {programs} /usr/local/sbin/iscsiadm; do test -x $p; done; \
         blkid -V; mkfs.ext4 -V; mkfs.xfs -V; xfs_growfs -V"
    );
    let run = process::run(
        Command::new("chroot")
            .arg(&rootfs)
            .args(["/bin/sh", "-c", &script]),
    );
    fs::remove_dir_all(&oci)?;
    fs::remove_dir_all(&rootfs)?;
    run.map_err(|e| format!("the image's programs do not run in it: {e}").into())
}

/// The `sha256:` digests named in an OCI JSON document, in order, as hex.
fn digests(json: &str) -> Vec<&str> {
    json.split("\"digest\":\"sha256:")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_package_must_be_pinned() {
        let pins = parse_pins("# c\n\nutil-linux=2.38.1-5+deb12u3  # why\nlibc6=2.36-9\n").unwrap();
        assert_eq!(pins, ["util-linux=2.38.1-5+deb12u3", "libc6=2.36-9"]);
        for bad in [
            "e2fsprogs\n",
            "=1.0\n",
            "x=\n",
            "a b=1\n",
            "x=1;rm\n",
            "# only\n",
        ] {
            assert!(parse_pins(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn digests_are_read_in_order_and_checked() {
        let h = |c: char| c.to_string().repeat(64);
        let doc = format!(
            r#"{{"config":{{"digest":"sha256:{}"}},"layers":[{{"digest":"sha256:{}"}},{{"digest":"sha256:../../x"}},{{"digest":"sha256:{}"}}]}}"#,
            h('a'),
            h('b'),
            h('c')
        );
        assert_eq!(digests(&doc), [h('a'), h('b'), h('c')]);
    }

    #[test]
    fn the_checked_in_pins_parse() {
        let text = fs::read_to_string(paths::root().join("image/packages")).unwrap();
        let pins = parse_pins(&text).unwrap();
        assert!(pins.iter().any(|p| p.starts_with("e2fsprogs=")), "{pins:?}");
    }
}
