//! Opening a TUN device (layer 3, no packet-information header), with UDP segmentation
//! offload where the kernel has it (see [`crate::gso`]).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use nix::libc;

use crate::Error;

/// `struct ifreq` as TUNSETIFF reads it: name, then flags in the union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An attached TUN device; `vnet` says whether every packet read or written carries a
/// `virtio_net_hdr` (UDP segmentation offload on).
pub struct Tun {
    pub file: File,
    pub vnet: bool,
}

/// Attaches to TUN device `dev` in the calling thread's namespace, creating it if it does not
/// exist (a device created here disappears when the file closes). With `offload`, asks for
/// UDP GSO bursts whole (`TUN_F_USO4/6`, Linux 6.2 on); a kernel that refuses gets packets one
/// by one as before. The file is non-blocking: the engine polls it so it can stop.
pub fn open(dev: &str, offload: bool) -> Result<Tun, Error> {
    if offload {
        let tun = attach(dev, true)?;
        let features = libc::TUN_F_CSUM | libc::TUN_F_USO4 | libc::TUN_F_USO6;
        if set_offload(&tun, features).is_ok() {
            return Ok(Tun {
                file: tun,
                vnet: true,
            });
        }
        // Detach and attach again without the header: the device must not keep it.
        drop(tun);
    }
    let file = attach(dev, false)?;
    // Offloads belong to the device, not to the file: a persistent device keeps those an
    // earlier attachment set, and would go on handing over whole GSO bursts (with checksums
    // left unfinished) to a reader that expects datagrams. A kernel without TUNSETOFFLOAD
    // never set any, so its refusal is no error.
    let _ = set_offload(&file, 0);
    Ok(Tun { file, vnet: false })
}

fn set_offload(tun: &File, features: libc::c_uint) -> std::io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes its argument by value; the descriptor is open.
    let rc = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETOFFLOAD, features) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn attach(dev: &str, vnet: bool) -> Result<File, Error> {
    let err = |source| Error::Tun {
        dev: dev.to_owned(),
        source,
    };
    if dev.is_empty() || dev.len() >= libc::IFNAMSIZ {
        return Err(err(std::io::Error::other("name must be 1 to 15 bytes")));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(err)?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI | if vnet { libc::IFF_VNET_HDR } else { 0 })
            as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..dev.len()].copy_from_slice(dev.as_bytes());
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`; `req` has its layout and outlives
    // the call, and the descriptor is open.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok(file)
}
