//! keepalived in a hub's namespace, configured as deploy/keepalived/keepalived.conf.example
//! describes: VRRPv3, both instances `BACKUP` with `nopreempt`, the tunnel and LAN
//! addresses in one sync group tracked by `pepd health`, unicast adverts to the other hub.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cmd::{file_tail, spawn_logged};
use crate::topology::{command_in, LAN_DEV, SAT_DEV};
use crate::Error;

use super::topology::{hub_lan, hub_sat, LAN_VIP, TUNNEL_VIP};

/// What differs between the hubs' keepalived configs.
#[derive(Clone, Debug)]
pub struct VrrpSettings {
    /// This hub (from 1) and the other.
    pub hub: usize,
    pub other: usize,
    pub priority: u8,
    pub advert_int: Duration,
    /// The pepd executable whose `health` the script runs.
    pub pepd: PathBuf,
}

/// The config text for one hub.
pub fn config(s: &VrrpSettings) -> String {
    let advert = format!("{:.2}", s.advert_int.as_secs_f64());
    let instance =
        |name: &str, id: u8, dev: &str, own: Ipv4Addr, other: Ipv4Addr, vip: Ipv4Addr| {
            format!(
                "vrrp_instance {name} {{
    state BACKUP
    nopreempt
    interface {dev}
    virtual_router_id {id}
    priority {priority}
    advert_int {advert}
    unicast_src_ip {own}
    unicast_peer {{
        {other}
    }}
    virtual_ipaddress {{
        {vip}/24 dev {dev}
    }}
    track_interface {{
        {SAT_DEV}
        {LAN_DEV}
    }}
}}
",
                priority = s.priority,
            )
        };
    format!(
        "# Written by pep-testbed for hub {hub}.
global_defs {{
    router_id pepd-hub-{hub}
    vrrp_version 3
    script_user root
    vrrp_garp_master_delay 1
    vrrp_garp_master_repeat 3
}}

vrrp_script pepd_serving {{
    script \"{pepd} health --at 127.0.0.1:9464\"
    interval 1
    timeout 1
    fall 1
    rise 3
    init_fail
}}

vrrp_sync_group PEPD {{
    group {{
        PEPD_TUNNEL
        PEPD_LAN
    }}
    track_script {{
        pepd_serving
    }}
}}

{tunnel}
{lan}",
        hub = s.hub,
        pepd = s.pepd.display(),
        tunnel = instance(
            "PEPD_TUNNEL",
            74,
            SAT_DEV,
            hub_sat(s.hub),
            hub_sat(s.other),
            TUNNEL_VIP
        ),
        lan = instance(
            "PEPD_LAN",
            75,
            LAN_DEV,
            hub_lan(s.hub),
            hub_lan(s.other),
            LAN_VIP
        ),
    )
}

/// The one-sentence error when keepalived is not installed.
pub fn require() -> Result<(), Error> {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join("keepalived").is_file()));
    if found {
        Ok(())
    } else {
        Err(Error::Invalid(
            "keepalived is not installed: the standby scenarios need the Debian package \
             keepalived (scripts/install-keepalived.sh installs it without starting it)"
                .into(),
        ))
    }
}

/// keepalived running in a namespace; killed (with its VRRP child) when dropped.
pub struct Keepalived {
    child: Option<Child>,
    vrrp_pid_file: PathBuf,
    log: PathBuf,
}

impl Keepalived {
    /// Writes `DIR/keepalived-hK.conf` and starts keepalived on it in namespace `ns`.
    pub fn start(dir: &Path, ns: &str, settings: &VrrpSettings) -> Result<Keepalived, Error> {
        let name = format!("keepalived-h{}", settings.hub);
        let conf = dir.join(format!("{name}.conf"));
        fs::write(&conf, config(settings))?;
        let log = dir.join(format!("{name}.log"));
        let vrrp_pid_file = dir.join(format!("{name}-vrrp.pid"));
        let mut cmd = command_in(ns, "keepalived");
        cmd.args(["--dont-fork", "--log-console", "--log-detail", "--vrrp"])
            .arg("-f")
            .arg(&conf)
            .arg("-p")
            .arg(dir.join(format!("{name}.pid")))
            .arg("-r")
            .arg(&vrrp_pid_file);
        let child = spawn_logged(cmd, &log)?;
        Ok(Keepalived {
            child: Some(child),
            vrrp_pid_file,
            log,
        })
    }

    /// SIGKILL to keepalived and its VRRP process: no advert of priority 0, no address
    /// removed.
    pub fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
    }

    fn signal(&mut self, signal: Signal) {
        if let Some(pid) = fs::read_to_string(&self.vrrp_pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            let _ = kill(Pid::from_raw(pid), signal);
        }
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), signal);
            let _ = c.wait();
        }
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        file_tail(&self.log, lines)
    }
}

impl Drop for Keepalived {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_hub_advertises_to_the_other_with_both_addresses_in_one_group() {
        let c = config(&VrrpSettings {
            hub: 2,
            other: 1,
            priority: 100,
            advert_int: Duration::from_millis(500),
            pepd: PathBuf::from("/usr/bin/pepd"),
        });
        assert!(c.contains("script \"/usr/bin/pepd health --at 127.0.0.1:9464\""));
        assert!(c.contains("vrrp_version 3"));
        assert_eq!(c.matches("advert_int 0.50").count(), 2);
        assert_eq!(c.matches("priority 100").count(), 2);
        assert_eq!(c.matches("nopreempt").count(), 2);
        assert!(c.contains("unicast_src_ip 198.19.0.12\n    unicast_peer {\n        198.19.0.11\n"));
        assert!(c.contains("unicast_src_ip 198.18.3.12\n    unicast_peer {\n        198.18.3.11\n"));
        assert!(c.contains("198.19.0.1/24 dev sat0"));
        assert!(c.contains("198.18.3.1/24 dev lan0"));
        assert!(c.contains("group {\n        PEPD_TUNNEL\n        PEPD_LAN\n    }"));
    }
}
