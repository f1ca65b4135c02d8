//! The paths a follower could not connect, for the volume's condition and the metrics.
//!
//! A follower's failed connect was only a log line: NodeGetVolumeStats called the volume
//! healthy while its discovery service listed a port the node had no controller on (a host
//! secret the subsystem refuses, a port that does not answer). The followers record each
//! such path here until it is connected or leaves the log, and the condition of every volume
//! of its subsystem names it.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use lunkit::ErrorKind;

/// A path: `(subsystem NQN, "address:service")`.
type PathKey = (String, String);

/// Why a listed path has no controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unconnected {
    /// `address:service`.
    pub path: String,
    /// The connect's error.
    pub reason: String,
    /// The subsystem refused this host (authentication, or the host is not allowed).
    pub refused: bool,
}

static PATHS: Mutex<BTreeMap<PathKey, Unconnected>> = Mutex::new(BTreeMap::new());

fn paths() -> MutexGuard<'static, BTreeMap<PathKey, Unconnected>> {
    PATHS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records that the path `address:service` of `subsystem` could not be connected.
pub fn failed(subsystem: &str, path: &str, error: &lunkit::Error) {
    let refused = error.kind() == ErrorKind::PermissionDenied;
    paths().insert(
        (subsystem.to_owned(), path.to_owned()),
        Unconnected {
            path: path.to_owned(),
            reason: error.to_string(),
            refused,
        },
    );
}

/// Forgets the path: connected, or no longer listed.
pub fn settled(subsystem: &str, path: &str) {
    paths().remove(&(subsystem.to_owned(), path.to_owned()));
}

/// Forgets every path of a subsystem not in `followed`: no follower acts on it any more (its
/// volumes were unstaged).
pub fn keep_only(followed: &std::collections::BTreeSet<String>) {
    paths().retain(|(s, _), _| followed.contains(s));
}

/// The paths of `subsystem` that have no controller, by path.
pub fn of(subsystem: &str) -> Vec<Unconnected> {
    paths()
        .iter()
        .filter(|((s, _), _)| s == subsystem)
        .map(|(_, u)| u.clone())
        .collect()
}

/// How many listed paths have no controller: `(refused by the subsystem, other)`.
pub fn counts() -> (usize, usize) {
    let p = paths();
    let refused = p.values().filter(|u| u.refused).count();
    (refused, p.len() - refused)
}

/// The gauge of [`counts`], in the metrics' exposition text.
pub fn render(out: &mut String) {
    use std::fmt::Write;
    let (refused, other) = counts();
    let _ = write!(
        out,
        "# HELP lunkit_csi_follower_paths_unconnected Ports a discovery service lists that \
         the node has no controller on, by why.\n\
         # TYPE lunkit_csi_follower_paths_unconnected gauge\n\
         lunkit_csi_follower_paths_unconnected{{reason=\"refused\"}} {refused}\n\
         lunkit_csi_follower_paths_unconnected{{reason=\"other\"}} {other}\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_named_until_it_is_connected_or_its_follower_stops() {
        let nqn = "nqn.2014-08.org.example:unconnected-test";
        let denied = lunkit::Error::Refused {
            what: "connect: the subsystem refused the host's secret".into(),
        };
        failed(nqn, "10.0.0.2:4420", &denied);
        failed(
            nqn,
            "10.0.0.3:4420",
            &lunkit::Error::NotFound { what: "x".into() },
        );
        let named = of(nqn);
        assert_eq!(named.len(), 2, "{named:?}");
        assert!(named[0].refused && !named[1].refused, "{named:?}");
        assert!(counts().0 >= 1 && counts().1 >= 1);
        settled(nqn, "10.0.0.2:4420");
        assert_eq!(of(nqn).len(), 1);
        keep_only(&std::collections::BTreeSet::new());
        assert!(of(nqn).is_empty());
    }
}
