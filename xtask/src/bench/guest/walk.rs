//! The walk rows (issue 57): a 2-path volume's detach on nodes of [`WALK_NODES`] processes
//! of the kinds a Kubernetes node runs, against the kernel floor, the floor after a plain
//! in-use reading and the shell sequence, udevd and multipathd running. The in-use check
//! reads every process (the kernel counts no SCSI disk's openers), so these rows show how a
//! detach grows with the node.
//!
//! A node of N processes ([`NODE_PY`], one `python3` that forks them all, from the guest's
//! tmpfs where they have files of their own):
//!
//! - *daemons*, N/10: each maps 50 of 80 64 KiB "libraries" (4 ranges each, as a loader maps
//!   one) and 3 files of its own, and holds 30 descriptors (files, pipes, socket pairs);
//! - *namespace pairs*, N/20 (N/10 processes): two processes in a mount namespace of their
//!   own with 5 tmpfs mounts on `/mnt`;
//! - *churn*: one parent that keeps N/20 children alive, each exiting after 0–50 ms;
//! - *small*: the rest, `sleep`.
//!
//! The rows run lunkit's detach resident (as the plugin calls the library), not spawned:
//! 15 rounds of the 1,000-process node take minutes a method.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{
    CROWD_PYTHON, Ctx, TEARDOWN_LUN, TIMEOUT, count_fds, count_processes, crowd_alive,
    on_mapped_lab, poll_every, said_ready, say, settle, teardown_methods_of,
};
use crate::Result;
use crate::bench::WALK_NODES;

/// The node's processes: `python3 -c NODE_PY DIR N`. Prints `ready` once every long-lived
/// one runs. Every process holds `DIR/marker` open (inherited through `exec`), so that
/// [`crowd_alive`] sees any that outlived the parent; each dies with its parent
/// (`PR_SET_PDEATHSIG`, which `exec` keeps).
const NODE_PY: &str = r#"
import ctypes, os, random, signal, socket, sys, time
d, n = sys.argv[1], int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
marker = os.path.join(d, "marker")
open(marker, "w").close()
def blob(p):
    with open(p, "wb") as f:
        f.write(b"\1" * 65536)
    return p
libs = [blob(os.path.join(d, "lib%d.so" % i)) for i in range(80)]
r, w = os.pipe()
me = os.getpid()
def born():
    if libc.prctl(1, 9) != 0 or os.getppid() != me:
        os._exit(1)
    os.close(r)
    os.set_inheritable(os.open(marker, os.O_RDONLY), True)
def ready():
    os.write(w, b"x")
    os.close(w)
def pause():
    while True:
        signal.pause()
def spawn(f, *a):
    if os.fork() == 0:
        try:
            born()
            f(*a)
        finally:
            os._exit(1)
def sleeper():
    ready()
    os.execv("/bin/sleep", ["sleep", "infinity"])
# mmap(2) itself: Python's mmap module keeps a descriptor per mapping, a loader does not.
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
def map_file(p, ranges, size):
    fd = os.open(p, os.O_RDONLY)
    for o in range(ranges):
        if libc.mmap(None, size, 1, 2, fd, o * size) in (None, ctypes.c_void_p(-1).value):
            os._exit(4)
    os.close(fd)
def daemon(k):
    for j in range(50):
        map_file(libs[(k * 7 + j) % 80], 4, 16384)
    for j in range(3):
        map_file(blob(os.path.join(d, "own-%d-%d" % (k, j))), 1, 65536)
    fds = [os.open(libs[j], os.O_RDONLY) for j in range(10)]
    for _ in range(5):
        fds += os.pipe()
    socks = [socket.socketpair() for _ in range(5)]
    ready()
    pause()
def pair():
    # A mount namespace of its own, its mounts private (none reach the node's), 5 on /mnt.
    if libc.unshare(0x20000) != 0 or libc.mount(None, b"/", None, 0x4000 | 0x40000, None) != 0:
        os._exit(2)
    for _ in range(5):
        if libc.mount(b"tmpfs", b"/mnt", b"tmpfs", 0, None) != 0:
            os._exit(3)
    if os.fork() == 0:
        libc.prctl(1, 9)
        os.execv("/bin/sleep", ["sleep", "infinity"])
    ready()
    pause()
def churn(m):
    ready()
    live = 0
    while True:
        while live < m:
            if os.fork() == 0:
                time.sleep(random.random() * 0.05)
                os._exit(0)
            live += 1
        os.wait()
        live -= 1
daemons, pairs, churners = n // 10, n // 20, max(n // 20, 1)
small = n - daemons - 2 * pairs - churners
for k in range(daemons):
    spawn(daemon, k)
for _ in range(pairs):
    spawn(pair)
spawn(churn, churners - 1)
for _ in range(small):
    spawn(sleeper)
os.close(w)
want, got = daemons + pairs + 1 + small, 0
while got < want:
    b = os.read(r, want - got)
    if not b:
        sys.exit("a node process died before it was ready")
    got += len(b)
print("ready", flush=True)
pause()
"#;

/// A node's processes, ended when dropped.
struct Node {
    parent: Child,
    dir: PathBuf,
}

impl Node {
    fn start(processes: usize) -> Result<Node> {
        let dir = PathBuf::from("/tmp/lunkit-bench-node");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let mut parent = Command::new(CROWD_PYTHON)
            .args(["-c", NODE_PY])
            .arg(&dir)
            .arg(processes.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{CROWD_PYTHON} for the node's processes: {e}"))?;
        let stdout = parent.stdout.take();
        let node = Node { parent, dir };
        // Forking a thousand processes under TCG takes tens of seconds.
        let stdout = stdout.ok_or("the node's stdout")?;
        said_ready(stdout, TIMEOUT * 5, "the node's processes")?;
        Ok(node)
    }

    fn stop(mut self) -> Result<()> {
        let _ = self.parent.kill();
        let _ = self.parent.wait();
        poll_every(
            Duration::from_millis(200),
            "the node's processes to exit",
            || !crowd_alive(&self.dir),
        )?;
        let _ = fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.parent.kill();
        let _ = self.parent.wait();
    }
}

/// What the walk reads on the node now: processes, descriptors, distinct mapped files and
/// mount namespaces.
fn makeup() -> String {
    let mut files = std::collections::BTreeSet::new();
    let mut namespaces = std::collections::BTreeSet::new();
    let mut mappings = 0usize;
    for p in fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(ns) = fs::read_link(p.path().join("ns/mnt")) {
            namespaces.insert(ns);
        }
        let Ok(maps) = fs::read_to_string(p.path().join("maps")) else {
            continue;
        };
        for file in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
            if file.starts_with('/') {
                mappings += 1;
                files.insert(file.to_owned());
            }
        }
    }
    format!(
        "{} processes, {} descriptors, {mappings} file mappings of {} files, {} mount \
         namespaces",
        count_processes(),
        count_fds(),
        files.len(),
        namespaces.len()
    )
}

/// Every node size in turn on one lab: its processes started, the teardown methods as row
/// `walkN`, its processes ended.
pub(super) fn phase(ctx: &mut Ctx) -> Result<()> {
    on_mapped_lab(ctx, "the walk rows", |ctx, lab| {
        say(&format!("walk: the lab alone: {}", makeup()));
        for &n in WALK_NODES {
            let t0 = Instant::now();
            let node = Node::start(n)?;
            settle(ctx)?;
            say(&format!(
                "walk{n}: ready after {:.1} s: {}",
                t0.elapsed().as_secs_f64(),
                makeup()
            ));
            let row = format!("walk{n}");
            let measured = teardown_methods_of(ctx, &row, &lab.sessions, TEARDOWN_LUN, true, false);
            let stopped = node.stop();
            measured.and(stopped)?;
        }
        Ok(())
    })
}
