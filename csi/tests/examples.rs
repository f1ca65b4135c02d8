//! The example manifests in `deploy/examples/` are volumes the plugin takes: each PV's
//! `volumeAttributes`, with the Secret its `nodeStageSecretRef` names as the stage secrets,
//! go through the plugin's own parser ([`lunkit_csi::attrs::parse`]) and must be accepted as
//! the transport the file is named after. The parser ignores keys it does not know, so each
//! key (and each secret key) is also changed to a value no key accepts: the volume must then
//! be refused or come out different, which shows the plugin reads the key; a misspelt key
//! (`sessionChapAuth`) would change nothing and fail the test.
//!
//! The YAML is read by a small reader of the files' own form (block mappings of quoted or
//! plain scalars); `cargo xtask manifests` parses them with a real YAML parser and validates
//! them against the Kubernetes schemas.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lunkit_csi::attrs::{self, Volume};

type Map = HashMap<String, String>;

/// One PV of an example file, with what it takes from the file.
#[derive(Debug)]
struct Example {
    file: String,
    handle: String,
    attrs: Map,
    secrets: Map,
}

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples")
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// A scalar as YAML reads it, for the forms the examples use: `"…"` (JSON's escapes),
/// `'…'` (`''` for a quote) or plain.
fn scalar(text: &str) -> String {
    let t = text.trim();
    if t.starts_with('"') {
        serde_json::from_str(t).unwrap_or_else(|e| panic!("{t}: {e}"))
    } else if let Some(inner) = t.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        inner.replace("''", "'")
    } else {
        t.split(" #").next().unwrap_or(t).trim().to_owned()
    }
}

/// The `key: value` entries of the block mapping under the line `name:` in `doc`.
fn block(doc: &[&str], name: &str) -> Option<Map> {
    let at = doc.iter().position(|l| l.trim() == format!("{name}:"))?;
    let base = indent(doc[at]);
    let mut map = Map::new();
    for line in &doc[at + 1..] {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if indent(line) <= base {
            break;
        }
        let (k, v) = t
            .split_once(": ")
            .unwrap_or_else(|| panic!("{name}: {t:?} is not key: value"));
        map.insert(scalar(k), scalar(v));
    }
    Some(map)
}

/// The value of the first line `key: value` in `doc`.
fn field(doc: &[&str], key: &str) -> Option<String> {
    doc.iter()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
        .map(scalar)
}

fn read(file: &Path) -> Vec<Example> {
    let text = std::fs::read_to_string(file).unwrap();
    let docs: Vec<Vec<&str>> = text.split("\n---\n").map(|d| d.lines().collect()).collect();
    let kind = |d: &Vec<&str>, k: &str| d.iter().any(|l| *l == format!("kind: {k}"));
    let secrets: HashMap<String, Map> = docs
        .iter()
        .filter(|d| kind(d, "Secret"))
        .map(|d| {
            let name = field(d, "name").expect("a Secret's name");
            (name, block(d, "stringData").expect("a Secret's stringData"))
        })
        .collect();
    docs.iter()
        .filter(|d| kind(d, "PersistentVolume"))
        .map(|d| {
            let secrets = match block(d, "nodeStageSecretRef") {
                None => Map::new(),
                Some(r) => secrets
                    .get(&r["name"])
                    .unwrap_or_else(|| panic!("{}: no Secret {}", file.display(), r["name"]))
                    .clone(),
            };
            Example {
                file: file.file_name().unwrap().to_string_lossy().into_owned(),
                handle: field(d, "volumeHandle").expect("a volumeHandle"),
                attrs: block(d, "volumeAttributes").expect("volumeAttributes"),
                secrets,
            }
        })
        .collect()
}

fn all() -> Vec<Example> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files.iter().flat_map(|f| read(f)).collect()
}

/// The keys of `attrs` and `secrets` whose value does not matter to the parser: changed to
/// a value none accepts, the volume is still accepted, and the same.
fn unread_keys(id: &str, attrs: &Map, secrets: &Map) -> Vec<String> {
    let volume = attrs::parse(id, attrs, secrets).unwrap();
    let mut unread = Vec::new();
    for (which, map) in [("attribute", attrs), ("secret", secrets)] {
        for key in map.keys() {
            let mut changed = map.clone();
            changed.insert(key.clone(), "%not a value%".into());
            let got = if which == "attribute" {
                attrs::parse(id, &changed, secrets)
            } else {
                attrs::parse(id, attrs, &changed)
            };
            if got.is_ok_and(|v| v == volume) {
                unread.push(format!("{which} {key}"));
            }
        }
    }
    unread.sort();
    unread
}

#[test]
fn every_example_is_a_volume_the_plugin_takes_as_its_transport() {
    let examples = all();
    let files: Vec<&str> = examples.iter().map(|e| e.file.as_str()).collect();
    assert_eq!(
        files,
        [
            "fc.yaml",
            "iscsi-chap.yaml",
            "iscsi.yaml",
            "nvme-tcp-auth.yaml",
            "nvme-tcp.yaml",
            "raw-block.yaml"
        ]
    );
    for e in &examples {
        let volume = attrs::parse(&e.handle, &e.attrs, &e.secrets)
            .unwrap_or_else(|err| panic!("{}: {err}", e.file));
        match (&volume, e.file.as_str()) {
            (Volume::Fc(_), "fc.yaml") => {}
            (Volume::Nvme(v), f) if f.starts_with("nvme-tcp") => {
                assert_eq!(v.auth.secret.is_some(), f.contains("auth"), "{f}");
                assert_eq!(v.auth.ctrl_secret.is_some(), f.contains("auth"), "{f}");
            }
            (Volume::Iscsi(v), f) if f.starts_with("iscsi") || f == "raw-block.yaml" => {
                assert_eq!(v.chap.is_some(), f.contains("chap"), "{f}");
            }
            (v, f) => panic!("{f}: parsed as {v:?}"),
        }
    }
}

#[test]
fn every_key_of_the_examples_is_one_the_plugin_reads() {
    for e in all() {
        let unread = unread_keys(&e.handle, &e.attrs, &e.secrets);
        assert!(
            unread.is_empty(),
            "{}: the plugin does not read {unread:?}",
            e.file
        );
    }
}

#[test]
fn a_misspelt_key_is_found_unread() {
    let e = all().into_iter().find(|e| e.file == "iscsi.yaml").unwrap();
    let mut attrs = e.attrs.clone();
    attrs.insert("sessionChapAuth".into(), "true".into());
    attrs.insert("iscsiinterface".into(), "eth1".into());
    assert_eq!(
        unread_keys(&e.handle, &attrs, &e.secrets),
        ["attribute iscsiinterface", "attribute sessionChapAuth"]
    );
}
