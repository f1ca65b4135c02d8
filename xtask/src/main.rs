//! `cargo xtask`: builds, provisions and boots the QEMU lab (docs/DESIGN.md, "Testing").
//!
//! Host commands boot a guest with virtme-ng (TCG: /dev/kvm hangs on these machines) sharing
//! the host root read-only; the guest runs this same binary (`xtask guest ...`) to build the
//! lab with the fixtures of the `lunkit-lab` crate (tests/vm/support), which the VM tests use too.

mod architecture;
mod bench;
mod capture;
mod checks;
mod guest;
mod host;
mod image;
mod jit;
mod kmsg;
mod labkernel;
mod labstate;
mod manifests;
mod overlay;
mod paths;
mod process;
mod provision;
mod split;
mod stacks;
mod testrun;
mod twonode;
mod vm;
mod vmtests;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command>

  test [--host-only | --vm-only] [--repeat N] [FILTER]
                          fmt check, clippy, docs (rustdoc warnings denied), cargo
                          check at the declared rust-version, the deploy/ manifests
                          against the Kubernetes schemas, host tests, then the
                          VM tests (names containing FILTER, or a part of it
                          split at |), each alone with a checked lab reset
                          between them, a fresh boot when the reset cannot
                          clean, in two guests side by side for the default
                          kernel (LUNKIT_VM_GUESTS=1: one); --host-only: stop
                          before the VM;
                          --repeat N: VM tests only, N times from fresh boots, with
                          a flake report
  lab [-- CMD...]         boot the iSCSI multipath lab, show `lunkit list`, run CMD there
  vm [--timeout S] -- CMD...
                          run CMD as root in the guest, return its exit code
  bench [--runs N] [--only GROUP,...] [--aslr]
                          lunkit against the kernel floor and the peer tools, one boot
                          (norandmaps unless --aslr); table and JSON in target/bench/
                          (groups: scan, node, scale, teardown, crowd, busy, resize,
                          nvme, atonce, atonce32, listing, flush)
  fixtures [NAME...]      regenerate tests/fixtures/{scsi-debug,iscsi-multipath} in the VM
  capture-sysfs [--note TEXT] DEST
                          copy this machine's storage sysfs into DEST (run it in the guest)
  architecture [--check]  print ARCHITECTURE.md's table of figures, computed from src/;
                          --check: fail, as `test` does, when the document states others
  manifests               validate deploy/ against the Kubernetes schemas (offline)
  provision               install what the VM needs (root on Debian) or say what is missing;
                          resolve the lab's 6.12 (newest with NVMe auth; LUNKIT_AUTH_KERNEL)
  image [--profile P] [--out FILE]
                          the lunkit-csi image from Debian's packages (mmdebstrap,
                          buildah), as an OCI archive in target/image/
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match cmd.as_str() {
        "test" => host::test(rest),
        "lab" => host::lab(rest),
        "vm" => host::vm(rest),
        "fixtures" => host::fixtures(rest),
        "bench" => bench::main(rest),
        "capture-sysfs" => capture::main(rest),
        "architecture" => architecture::main(rest),
        "manifests" => manifests::validate().map(|()| 0),
        // The lab's 6.12 is resolved (and recorded) here, installed when a test boots it.
        "provision" => provision::ensure()
            .and_then(|_| labkernel::resolve())
            .map(|_| 0),
        "image" => image::main(rest),
        "guest" => guest::main(rest),
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            Ok(0)
        }
        other => Err(format!("unknown command {other:?}\n{USAGE}").into()),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xtask {cmd}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Errors are reported to the user, not handled.
type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;
