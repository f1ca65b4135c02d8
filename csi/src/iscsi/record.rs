//! open-iscsi's node and discovery records: where they are, and the CHAP secrets written
//! into them by the plugin itself (never on a command line).

// The parts of the iSCSI module share its imports, constants and runner.
use super::*;

/// The node record file of `iqn` through `portal` (`addr:port`, `[v6addr]:port`) on
/// `iface` in open-iscsi's node database `nodes`: `IQN/ADDR,PORT,TPGT/IFACE` once the portal
/// group tag is known, or the flat `IQN/ADDR,PORT` file that `-o new` writes without one
/// (open-iscsi 2.1.8).
pub fn record_path(nodes: &Path, iqn: &str, portal: &str, iface: Option<&str>) -> Result<PathBuf> {
    let (addr, port) = portal
        .rsplit_once(':')
        .ok_or_else(|| Error::Internal(format!("portal {portal:?} has no port")))?;
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    let flat = format!("{addr},{port}");
    let tagged = format!("{flat},");
    let dir = nodes.join(iqn);
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        Error::Internal(format!("open-iscsi's node records {}: {e}", dir.display()))
    })?;
    let found = entries
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n == flat || n.starts_with(&tagged)
            })
        })
        .ok_or_else(|| {
            Error::Internal(format!(
                "no node record of {iqn} through {portal} in {} after iscsiadm -o new",
                dir.display()
            ))
        })?;
    Ok(if found.is_dir() {
        found.join(iface.unwrap_or("default"))
    } else {
        found
    })
}

/// Writes the secret `settings` (`node.session.auth.password`...) into the node record of
/// `iqn` through `portal`, replacing any there: the record's other lines are kept, the new
/// ones go before its `# END RECORD` line, and the whole is written to a new file of mode
/// 0600 in the same directory, synced, and renamed over the record. iscsiadm reads the
/// record at `--login` and hands iscsid the credentials over its socket.
///
/// Values were checked by [`crate::attrs`]: no control character (a newline would be a
/// setting of its own), no spaces at the ends (the record's parser strips them).
pub fn write_secrets(
    nodes: &Path,
    iqn: &str,
    portal: &str,
    iface: Option<&str>,
    settings: &[(&str, &str)],
) -> Result<()> {
    rewrite_record(&record_path(nodes, iqn, portal, iface)?, settings)
}

/// Writes `settings` into the open-iscsi record file at `path` (a node record, or a
/// discovery record), as [`write_secrets`] describes.
pub fn rewrite_record(path: &Path, settings: &[(&str, &str)]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |what: &str, e: std::io::Error| {
        Error::Internal(format!(
            "{what} the record {} (its CHAP secrets): {e}",
            path.display()
        ))
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail("read", e))?;
    let text = with_settings(&text, settings);
    let tmp = path.with_file_name(format!(
        ".{}.lunkit-csi",
        path.file_name()
            .map_or_else(Default::default, |n| n.to_string_lossy())
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| fail("create a new", e))?;
    let written = f
        .write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail("write", e));
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// The SendTargets discovery record of `portal` (`addr:port`, `[v6addr]:port`) in the
/// open-iscsi database whose node records are in `nodes`: `../send_targets/ADDR,PORT/st_config`
/// (idbm.c's `ST_CONFIG_DIR` and `ST_CONFIG_NAME`).
pub fn discovery_record_path(nodes: &Path, portal: &str) -> Result<PathBuf> {
    let (addr, port) = portal
        .rsplit_once(':')
        .ok_or_else(|| Error::Internal(format!("portal {portal:?} has no port")))?;
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    let db = nodes.parent().unwrap_or(nodes);
    Ok(db
        .join("send_targets")
        .join(format!("{addr},{port}"))
        .join("st_config"))
}

/// The node record `text` with `settings` in place of any lines of the same names.
pub fn with_settings(text: &str, settings: &[(&str, &str)]) -> String {
    let key = |line: &str| line.split_once('=').map(|(k, _)| k.trim().to_owned());
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !key(l).is_some_and(|k| settings.iter().any(|(n, _)| *n == k)))
        .map(str::to_owned)
        .collect();
    let end = lines
        .iter()
        .rposition(|l| l.trim_start().starts_with("# END RECORD"))
        .unwrap_or(lines.len());
    for (i, (name, value)) in settings.iter().enumerate() {
        lines.insert(end + i, format!("{name} = {value}"));
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// Deletes the node record `base` names (`-m node -T IQN -p PORTAL -I IFACE`), best effort
/// (a record that is not there is what was wanted), within [`CLEANUP`] whatever the call's
/// deadline left: the record may hold a CHAP secret.
pub(super) fn delete_record(run: &mut Iscsiadm<'_>, base: &[&str]) {
    let mut delete = base.to_vec();
    delete.extend(["-o", "delete"]);
    let _ = run(&delete, CLEANUP);
}
