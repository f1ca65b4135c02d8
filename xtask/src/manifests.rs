//! The host step that validates `deploy/`: every kustomization rendered and every object
//! checked offline against the Kubernetes API schemas, in strict mode, by `xtask/manifests.py`
//! with PyPI's `kubernetes-validate` (which ships the schemas: nothing is fetched at check
//! time). Its virtualenv is made under the target directory on first use, like virtme-ng's,
//! so a fresh CI machine installs it the same way. The example volumes in `deploy/examples/`
//! are validated too, file by file, and where kustomize (or kubectl's) is on PATH every
//! kustomization is rendered by it as well and must give the checker's objects.

use std::path::PathBuf;
use std::process::Command;

use crate::process;
use crate::{Result, paths};

/// The kubernetes-validate release the check installs.
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

/// The Kubernetes releases whose schemas the manifests must satisfy: the oldest the
/// manifests are meant for, and the newest the pinned kubernetes-validate knows.
const VERSIONS: &[&str] = &["1.30.0", "1.37.0"];

/// `<target>/manifests-venv`, made (built beside and renamed) when missing.
fn venv() -> Result<PathBuf> {
    let venv = paths::target_dir().join("manifests-venv");
    if venv.join("bin/python").exists() {
        return Ok(venv);
    }
    let building = paths::target_dir().join(format!("manifests-venv.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    std::fs::create_dir_all(paths::target_dir())
        .map_err(|e| format!("cannot make {}: {e}", paths::target_dir().display()))?;
    process::run(Command::new("python3").args(["-m", "venv"]).arg(&building))
        .map_err(|e| format!("{e} (Debian: apt-get install python3-venv)"))?;
    process::run(Command::new(building.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        KUBERNETES_VALIDATE,
    ]))?;
    // Another run may have finished first: either venv is as good.
    if std::fs::rename(&building, &venv).is_err() {
        let _ = std::fs::remove_dir_all(&building);
    }
    Ok(venv)
}

/// Validates every manifest under `deploy/` against each of [`VERSIONS`]; any invalid
/// object, unknown field or kustomization the checker cannot render fails the step.
pub fn validate() -> Result<()> {
    let python = venv()?.join("bin/python");
    let script = paths::root().join("xtask/manifests.py");
    let deploy = paths::root().join("deploy");
    for version in VERSIONS {
        process::run(Command::new(&python).arg(&script).arg(version).arg(&deploy))
            .map_err(|e| format!("the manifests in deploy/ are not valid: {e}"))?;
    }
    Ok(())
}
