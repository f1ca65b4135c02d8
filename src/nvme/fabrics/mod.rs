//! `/dev/nvme-fabrics`: the kernel's NVMe over Fabrics connect interface.
//!
//! A connect is one `write(2)` of an option string (`transport=tcp,traddr=…,nqn=…`, the
//! grammar of `opt_tokens` in `drivers/nvme/host/fabrics.c`) to a descriptor opened on
//! `/dev/nvme-fabrics`, which blocks until the controller is created (the TCP connection, the
//! admin queue, Identify Controller, the I/O queues), followed by a `read(2)` on the same
//! descriptor of `instance=N,cntlid=M`. Reading a descriptor that wrote nothing gives
//! `instance=-1,cntlid=-1` followed by every option the kernel knows, which is how
//! [`supported_options`] learns what this kernel accepts before anything is written.
//!
//! The option string is built from typed values only ([`Nqn`], [`Uuid`], [`IpAddr`], numbers,
//! a checked interface name, checked DH-HMAC-CHAP [`Secret`]s), so no value can carry a `,`
//! or `=` into an option of its own. A secret is in the string written to the kernel and
//! nowhere else: errors and helper subjects name the connect, never its options.
//! The parsers here are pure and fuzzed (`fuzz/fuzz_targets/nvme_fabrics.rs`).

use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::net::IpAddr;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::id::{Nqn, Uuid};
use crate::nvme::dhchap::Secret;
use crate::root::Root;

mod device;

#[cfg(test)]
use device::{connect_hint, option_value};
pub use device::{supported_options, write};

/// The longest option string the kernel takes: `nvmf_dev_write` refuses more than a page.
pub const MAX_OPTIONS_LEN: usize = 4096;

/// Default time a connect may take: the kernel's own connect timeouts are longer
/// (`NVME_TCP` waits out TCP's SYN retries), so the deadline is the caller's.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// An NVMe over Fabrics transport lunkit connects over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// NVMe/TCP (`nvme-tcp`).
    Tcp,
}

impl Transport {
    /// The kernel's name (`tcp`), as in `transport=` and a controller's `transport`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Transport {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "rdma" | "fc" | "loop" => Err(Error::invalid(
                "transport",
                s,
                "not supported by lunkit yet (only tcp)",
            )),
            _ => Err(Error::invalid(
                "transport",
                s,
                "unknown NVMe over Fabrics transport (expected tcp)",
            )),
        }
    }
}

/// A network interface name, as the kernel checks one (`dev_valid_name`): 1 to 15 bytes,
/// not `.` or `..`, with no `/`, `:`, white space, and here no `,` or `=` either.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Interface(String);

impl Interface {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Interface {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.is_empty() || s.len() > 15 || s == "." || s == ".." {
            return Err(Error::invalid(
                "interface",
                s,
                "must be 1 to 15 bytes, not . or ..",
            ));
        }
        if s.bytes()
            .any(|b| !b.is_ascii_graphic() || matches!(b, b'/' | b':' | b',' | b'='))
        {
            return Err(Error::invalid(
                "interface",
                s,
                "may hold only printable ASCII other than / : , =",
            ));
        }
        Ok(Interface(s.to_owned()))
    }
}

/// Who this node is to the subsystem: the `hostnqn=` and `hostid=` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The host NQN.
    pub nqn: Nqn,
    /// The host identifier; `None` lets [`crate::nvme::connect`] choose it
    /// ([`Host::id_from_nqn`], after the id the kernel already holds for this NQN).
    pub id: Option<Uuid>,
}

/// The prefix of an NQN made from a UUID (NVMe Base 2.0, 4.5): `<prefix><uuid>`.
const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

impl Host {
    /// The host id for this NQN when none is given: the UUID an NQN of the form
    /// `nqn.2014-08.org.nvmexpress:uuid:<uuid>` carries (the rule nvme-cli follows, and how
    /// the kernel makes its own default host), else a UUID derived from the NQN's bytes.
    ///
    /// Why a connect always needs one: newer kernels (Debian's 6.12, not its 6.1) keep one
    /// host id per host NQN in nvme-fabrics and refuses a connect whose NQN
    /// or id is already paired otherwise (`EINVAL`, "found same hostid … but different
    /// hostnqn"). Without `hostid=` the kernel takes its default host's id, which is paired
    /// with the default NQN, so any other NQN is refused.
    ///
    /// The derived id is FNV-1a (128 bits) of the NQN, marked as a version-8 (custom) UUID:
    /// the same NQN gets the same id on every node and after every reboot, and two NQNs
    /// share one only by a 2^-122 chance. It is not secret and needs not be: the NQN is the
    /// host's identity to a subsystem; the id only has to stay paired with it.
    pub fn id_from_nqn(&self) -> Uuid {
        if let Some(u) = self
            .nqn
            .as_str()
            .strip_prefix(UUID_NQN_PREFIX)
            .and_then(|u| u.parse::<Uuid>().ok())
        {
            return u;
        }
        let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
        for &b in self.nqn.as_str().as_bytes() {
            h ^= u128::from(b);
            h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
        }
        let mut bytes = h.to_be_bytes();
        bytes[6] = (bytes[6] & 0x0f) | 0x80; // version 8
        bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 9562 variant
        Uuid::from_bytes(bytes)
    }

    /// The node's own identity, from `<root>/etc/nvme/hostnqn` and `<root>/etc/nvme/hostid`
    /// (written by `nvme gen-hostnqn` or the image; one line each).
    ///
    /// [`Error::NotFound`] when `hostnqn` is missing: the kernel would otherwise use a host NQN
    /// it makes up each time `nvme-fabrics` is loaded, and the subsystem's access list would
    /// stop knowing this node after a reboot. A missing `hostid` is `None`; a malformed file is
    /// [`Error::Invalid`].
    pub fn from_node(root: &Root) -> Result<Host> {
        let nqn_path = root.etc("nvme/hostnqn");
        let nqn = match read_line(&nqn_path)? {
            Some(line) => line.parse()?,
            None => {
                return Err(Error::NotFound {
                    what: format!(
                        "this host has no NVMe host NQN: none was given and {file} does not \
                         exist; write one there (`nvme gen-hostnqn > {file}`) or pass one \
                         (`host`, the CLI's --hostnqn)",
                        file = nqn_path.display()
                    ),
                });
            }
        };
        let id = read_line(&root.etc("nvme/hostid"))?
            .map(|l| l.parse())
            .transpose()?;
        Ok(Host { nqn, id })
    }
}

/// The first line of a small text file, trimmed; `None` when the file does not exist.
fn read_line(path: &Path) -> Result<Option<String>> {
    let mut text = String::new();
    match fs::File::open(path) {
        Ok(f) => f
            .take(4096)
            .read_to_string(&mut text)
            .map_err(|e| Error::io(path, e))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    Ok(text.lines().next().map(|l| l.trim().to_owned()))
}

/// One controller to create: one path to a subsystem.
///
/// ```
/// use lunkit::nvme::ConnectOptions;
///
/// let opts = ConnectOptions::new(
///     "192.0.2.10".parse()?,
///     4420,
///     "nqn.2016-06.io.spdk:cnode1".parse()?,
/// );
/// assert_eq!(opts.trsvcid, 4420);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// The transport (`transport=`).
    pub transport: Transport,
    /// The target's address (`traddr=`).
    pub traddr: IpAddr,
    /// The target's port (`trsvcid=`), 4420 for I/O controllers by convention.
    pub trsvcid: u16,
    /// The subsystem (`nqn=`).
    pub nqn: Nqn,
    /// This node's identity; `None` reads it with [`Host::from_node`].
    pub host: Option<Host>,
    /// Seconds the kernel keeps reconnecting after the link is lost before it deletes the
    /// controller (`ctrl_loss_tmo=`); `Some(-1)` reconnects forever. `None`: the kernel's 600.
    pub ctrl_loss_tmo: Option<i32>,
    /// Seconds between reconnect attempts (`reconnect_delay=`), at least 1.
    pub reconnect_delay: Option<u32>,
    /// How many I/O queues to ask for (`nr_io_queues=`), at least 1.
    pub nr_io_queues: Option<u32>,
    /// Keep-alive timeout in seconds (`keep_alive_tmo=`).
    pub keep_alive_tmo: Option<u32>,
    /// Connect through this interface only (`host_iface=`).
    pub host_iface: Option<Interface>,
    /// The host's DH-HMAC-CHAP secret (`dhchap_secret=`): the host proves itself with it
    /// to a subsystem that requires in-band authentication. Needs a kernel built with
    /// `CONFIG_NVME_HOST_AUTH` (Debian 12's 6.1 is not; its 6.12 is).
    pub dhchap_secret: Option<Secret>,
    /// The controller's secret (`dhchap_ctrl_secret=`): with it the authentication is
    /// bidirectional, and a controller that cannot prove itself with it is refused.
    ///
    /// A refusal either way (this secret, or [`dhchap_secret`](Self::dhchap_secret)) is
    /// usually `EKEYREJECTED` at once. Seen on 6.12 in about one refusal of five under TCG:
    /// the target dropped the queue before the host's failure message reached it, and the
    /// connect failed only at the kernel's admin command timeout (`nvme_core.admin_timeout`,
    /// 60 s), with `EKEYREJECTED` or `EIO`. A [`timeout`](Self::timeout) below that reports a
    /// timeout instead; the kernel still ends the attempt and leaves no controller.
    pub dhchap_ctrl_secret: Option<Secret>,
    /// Make a new controller even when one for the same path and host is there already
    /// (`duplicate_connect`): for a discovery controller read once and deleted, which must
    /// not be one that another caller's discovery made and is about to delete.
    pub duplicate_connect: bool,
    /// How long the connect may take.
    pub timeout: Duration,
}

impl ConnectOptions {
    /// A TCP connect to `nqn` at `traddr`:`trsvcid`, as this node, with the kernel's defaults.
    pub fn new(traddr: IpAddr, trsvcid: u16, nqn: Nqn) -> ConnectOptions {
        ConnectOptions {
            transport: Transport::Tcp,
            traddr,
            trsvcid,
            nqn,
            host: None,
            ctrl_loss_tmo: None,
            reconnect_delay: None,
            nr_io_queues: None,
            keep_alive_tmo: None,
            host_iface: None,
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            duplicate_connect: false,
            timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// `nqn at traddr:trsvcid`, for messages.
    pub fn describe(&self) -> String {
        match self.traddr {
            IpAddr::V4(a) => format!("{} at {a}:{}", self.nqn, self.trsvcid),
            IpAddr::V6(a) => format!("{} at [{a}]:{}", self.nqn, self.trsvcid),
        }
    }
}

/// The option string for `opts` as `host`, with each option in the kernel's spelling, and the
/// option names it uses (to check them against [`supported_options`]).
///
/// [`Error::Invalid`] for a value the kernel would refuse (`reconnect_delay=0`,
/// `nr_io_queues=0`, a `ctrl_loss_tmo` below -1) or a port of 0.
pub fn option_string(opts: &ConnectOptions, host: &Host) -> Result<(String, Vec<&'static str>)> {
    if opts.trsvcid == 0 {
        return Err(Error::invalid("port", "0", "must be 1 to 65535"));
    }
    let positive = |kind: &'static str, v: Option<u32>| match v {
        Some(0) => Err(Error::invalid(kind, "0", "must be at least 1")),
        _ => Ok(()),
    };
    positive("reconnect_delay", opts.reconnect_delay)?;
    positive("nr_io_queues", opts.nr_io_queues)?;
    if let Some(t) = opts.ctrl_loss_tmo.filter(|&t| t < -1) {
        return Err(Error::invalid(
            "ctrl_loss_tmo",
            &t.to_string(),
            "must be -1 (reconnect forever) or at least 0",
        ));
    }
    let mut names = vec!["transport", "traddr", "trsvcid", "nqn", "hostnqn"];
    let mut s = format!(
        "transport={},traddr={},trsvcid={},nqn={},hostnqn={}",
        opts.transport, opts.traddr, opts.trsvcid, opts.nqn, host.nqn
    );
    let mut push = |name: &'static str, value: Option<String>| {
        if let Some(v) = value {
            s.push_str(&format!(",{name}={v}"));
            names.push(name);
        }
    };
    push("hostid", host.id.map(|u| u.to_string()));
    push("ctrl_loss_tmo", opts.ctrl_loss_tmo.map(|v| v.to_string()));
    push(
        "reconnect_delay",
        opts.reconnect_delay.map(|v| v.to_string()),
    );
    push("nr_io_queues", opts.nr_io_queues.map(|v| v.to_string()));
    push("keep_alive_tmo", opts.keep_alive_tmo.map(|v| v.to_string()));
    push(
        "host_iface",
        opts.host_iface.as_ref().map(ToString::to_string),
    );
    push(
        "dhchap_secret",
        opts.dhchap_secret.as_ref().map(|k| k.expose().to_owned()),
    );
    push(
        "dhchap_ctrl_secret",
        opts.dhchap_ctrl_secret
            .as_ref()
            .map(|k| k.expose().to_owned()),
    );
    if opts.duplicate_connect {
        s.push_str(",duplicate_connect");
        names.push("duplicate_connect");
    }
    if s.len() >= MAX_OPTIONS_LEN {
        // The options' names only: their values may hold a secret.
        return Err(Error::invalid(
            "connect options",
            &names.join(","),
            "longer than the kernel takes (a page)",
        ));
    }
    Ok((s, names))
}

/// The kernel's answer to a connect: the controller it created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The controller's instance: it is `nvme<instance>`.
    pub instance: u32,
    /// The controller id the subsystem gave it.
    pub cntlid: u16,
}

/// Parses what a read of `/dev/nvme-fabrics` returns after a connect:
/// `instance=N,cntlid=M` and a newline (keys the kernel may add later are ignored).
///
/// [`Error::Invalid`] for anything else, including `instance=-1` (no controller).
pub fn parse_reply(text: &str) -> Result<Reply> {
    const KIND: &str = "nvme-fabrics reply";
    let (mut instance, mut cntlid) = (None, None);
    for field in text.trim_end_matches('\n').split(',') {
        match field.split_once('=') {
            Some(("instance", v)) if instance.is_none() => instance = crate::id::decimal(v),
            Some(("cntlid", v)) if cntlid.is_none() => cntlid = crate::id::decimal(v),
            Some((_, _)) => {}
            None if field.is_empty() => {}
            None => return Err(Error::invalid(KIND, text, "a field is not key=value")),
        }
    }
    match (instance, cntlid) {
        (Some(instance), Some(cntlid)) => Ok(Reply { instance, cntlid }),
        _ => Err(Error::invalid(
            KIND,
            text,
            "expected instance=<N>,cntlid=<N> with N not negative",
        )),
    }
}

/// Parses what a read of a fresh `/dev/nvme-fabrics` descriptor returns:
/// `instance=-1,cntlid=-1,transport=%s,traddr=%s,…,duplicate_connect,…`, into the option names
/// (`transport`, `duplicate_connect`).
pub fn parse_options(text: &str) -> Result<Vec<String>> {
    let rest = text
        .trim_end_matches('\n')
        .strip_prefix("instance=-1,cntlid=-1")
        .ok_or_else(|| {
            Error::invalid(
                "nvme-fabrics options",
                text,
                "does not start with instance=-1,cntlid=-1",
            )
        })?;
    Ok(rest
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|t| t.split_once('=').map_or(t, |(name, _)| name).to_owned())
        .collect())
}

#[cfg(test)]
mod tests;
