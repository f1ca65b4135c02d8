//! Deleting one NVMe controller (`delete_controller`), only as the object it was decided on.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::helper::{self, Subject};
use crate::nvme::sysfs as sysnvme;
use crate::root::Root;
use crate::uevent::{Action, Subscription, Uevent};
use crate::wait;

/// Deletes the NVMe controller `c`, as read from sysfs ([`sysnvme::controller`]) when the
/// caller decided to delete it: writes `1` to its `delete_controller` and waits until it is
/// gone, or `deadline`. The store itself is synchronous (`nvme_delete_ctrl_sync`), but can
/// wait for as long as the controller's queues drain, so it is bounded like every such write.
///
/// Its name is a cache: the kernel gives a new controller the lowest free instance, so
/// `nvme0` may be another controller by now. The attribute is opened first, then the
/// controller behind it read again; the write goes ahead only when it is the same sysfs
/// object with the same subsystem, controller id, address and host NQN, else it is refused
/// with [`Error::Replaced`] and nothing is written. A controller already gone is success.
///
/// ```no_run
/// # use std::time::{Duration, Instant};
/// let root = lunkit::Root::default();
/// if let Some(c) = lunkit::nvme::sysfs::controller(&root, "nvme0")? {
///     lunkit::nvme::delete_controller(&root, &c, Instant::now() + Duration::from_secs(30))?;
/// }
/// # Ok::<(), lunkit::Error>(())
/// ```
pub fn delete_controller(
    root: &Root,
    c: &sysnvme::NvmeController,
    deadline: Instant,
) -> Result<()> {
    let name = c.name.as_str();
    let dir = crate::sysfs::Confine::new(root)
        .dir(&sysnvme::controller_dir(root, name))
        .filter(|d| d.is_dir());
    let Some(dir) = dir else {
        return Ok(()); // Gone already.
    };
    let object = crate::sysfs::object_id(&dir);
    let path = dir.join("delete_controller");
    let mut backoff = wait::Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    let mut monitor = Subscription::open().ok();
    loop {
        let writer = match crate::sysfs::AttrWriter::open(&path) {
            Ok(w) => w,
            Err(e) if e.is_gone() && !dir.exists() => return Ok(()),
            Err(e) => return Err(e),
        };
        // Opened first, then checked: the write reaches the controller checked here or
        // nothing (kernfs). Its name may have been given to another controller since it was
        // listed (the kernel hands out the lowest free instance), which is refused.
        let Some(now) = sysnvme::controller(root, name)? else {
            return Ok(()); // Gone.
        };
        if let Some(why) = replaced(c, &now) {
            return Err(Error::Replaced {
                device: format!("NVMe controller {name}"),
                reason: format!(
                    "it is not the controller decided on any more ({why}): another was made \
                     under its name, and is left as it is"
                ),
            });
        }
        let what = || {
            format!(
                "write to {} (the controller is not answering)",
                path.display()
            )
        };
        match helper::bounded(Subject::write(&path, "1"), deadline, &what, move || {
            writer.write("1")
        }) {
            Ok(()) => break,
            // Removed since the open.
            Err(e) if e.errno() == Some(libc::ENODEV) => break,
            // A controller whose first connect has not finished cannot be deleted yet.
            Err(e) if e.errno() == Some(libc::EBUSY) && Instant::now() < deadline => {
                backoff.sleep(deadline);
            }
            Err(e) => return Err(e),
        }
    }
    let what = || format!("removal of NVMe controller {name}");
    let relevant = |ev: &Uevent| ev.action == Action::Remove;
    wait::until(monitor.as_mut(), deadline, &what, &relevant, || {
        Ok((crate::sysfs::object_id(&dir) != object || object.is_none()).then_some(()))
    })
}

/// How `now`, read under `was`'s name, differs from it: another sysfs object (deleted and made
/// again), or another subsystem, controller id, address or host NQN; `None` when it is the
/// same controller.
fn replaced(was: &sysnvme::NvmeController, now: &sysnvme::NvmeController) -> Option<String> {
    let differs = |what: &str, a: &Option<String>, b: &Option<String>| {
        (a != b).then(|| {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
            format!("{what} {} then, {} now", show(a), show(b))
        })
    };
    if was.object.is_some() && was.object != now.object {
        return Some("another sysfs object".into());
    }
    let cntlid = |c: &sysnvme::NvmeController| c.cntlid.map(|i| i.to_string());
    differs("subsystem", &was.subsysnqn, &now.subsysnqn)
        .or_else(|| differs("cntlid", &cntlid(was), &cntlid(now)))
        .or_else(|| differs("address", &was.address, &now.address))
        .or_else(|| differs("host NQN", &was.hostnqn, &now.hostnqn))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctrl() -> sysnvme::NvmeController {
        sysnvme::NvmeController {
            name: "nvme0".into(),
            transport: Some("tcp".into()),
            address: Some("traddr=127.0.0.1,trsvcid=4420".into()),
            state: Some("live".into()),
            parsed_state: None,
            subsysnqn: Some("nqn.2014-08.org.lunkit:a".into()),
            model: None,
            serial: None,
            namespaces: vec![],
            cntlid: Some(1),
            hostnqn: Some("nqn.2014-08.org.nvmexpress:uuid:1".into()),
            hostid: None,
            object: Some(crate::id::ObjectId { dev: 22, ino: 100 }),
        }
    }

    #[test]
    fn a_controller_is_the_one_decided_on_only_with_its_object_address_and_host() {
        let was = ctrl();
        assert_eq!(replaced(&was, &ctrl()), None);
        // A state or namespaces changing is the same controller.
        let mut busy = ctrl();
        busy.state = Some("resetting".into());
        busy.namespaces = vec!["nvme0c0n1".into()];
        assert_eq!(replaced(&was, &busy), None);

        let mut again = ctrl();
        again.object = Some(crate::id::ObjectId { dev: 22, ino: 101 });
        assert_eq!(replaced(&was, &again).unwrap(), "another sysfs object");
        let mut port = ctrl();
        port.address = Some("traddr=127.0.0.2,trsvcid=4420".into());
        assert!(replaced(&was, &port).unwrap().starts_with("address"));
        let mut host = ctrl();
        host.hostnqn = Some("nqn.2014-08.org.nvmexpress:uuid:2".into());
        assert!(replaced(&was, &host).unwrap().starts_with("host NQN"));
        let mut id = ctrl();
        id.cntlid = Some(2);
        assert_eq!(replaced(&was, &id).unwrap(), "cntlid 1 then, 2 now");
    }
}
