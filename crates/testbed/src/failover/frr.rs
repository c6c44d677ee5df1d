//! FRR (zebra and bgpd) in the active-set layout's namespaces, configured as
//! deploy/frr/frr.conf.example describes: each hub imports the kernel tables pepd writes its
//! announcements into and advertises them to the router over eBGP, the outage table's
//! routes with a longer AS path; the router learns every terminal's LAN from the hub that
//! serves it.
//!
//! The hubs accept nothing from the router: a hub needs no route to another hub's
//! terminals, and a learned one would only shadow its own announcements. The router never
//! opens a session (`passive`), so its connections never meet a hub's interception rules
//! on the way in.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Child;

use nix::sys::signal::{kill, Signal};
use nix::unistd::{chown, Group, Pid, User};

use crate::cmd::{file_tail, spawn_logged};
use crate::topology::command_in;
use crate::Error;

use super::topology::{hub_lan, ROUTER};

/// The kernel table pepd writes the routes of the terminals it serves into.
pub const SERVING_TABLE: u32 = 200;
/// The kernel table for terminals whose association is in an outage.
pub const OUTAGE_TABLE: u32 = 201;
/// The router's autonomous system.
const ROUTER_AS: u32 = 65000;
/// Where Debian's package puts the daemons.
const DAEMONS: &str = "/usr/lib/frr";
/// The user and group FRR's daemons drop to; the package creates them.
const FRR_USER: &str = "frr";

fn hub_as(k: usize) -> u32 {
    65010 + k as u32
}

/// BGP session timers (keepalive, hold) in seconds: a hub that is gone is withdrawn by
/// the router within the hold time.
const TIMERS: (u32, u32) = (1, 3);

/// Hub `k`'s zebra config: the tables pepd owns, imported into zebra's RIB.
pub fn hub_zebra(k: usize) -> String {
    format!(
        "frr defaults traditional\nhostname h{k}\nip import-table {SERVING_TABLE}\n\
         ip import-table {OUTAGE_TABLE}\n"
    )
}

/// Hub `k`'s bgpd config.
pub fn hub_bgpd(k: usize) -> String {
    let (keepalive, hold) = TIMERS;
    let asn = hub_as(k);
    format!(
        "frr defaults traditional
hostname h{k}
router bgp {asn}
 bgp router-id {id}
 no bgp ebgp-requires-policy
 neighbor {ROUTER} remote-as {ROUTER_AS}
 neighbor {ROUTER} timers {keepalive} {hold}
 neighbor {ROUTER} timers connect 1
 neighbor {ROUTER} advertisement-interval 0
 address-family ipv4 unicast
  redistribute table {SERVING_TABLE}
  redistribute table {OUTAGE_TABLE} route-map PEPD-OUTAGE
  neighbor {ROUTER} route-map ACCEPT-NOTHING in
 exit-address-family
!
route-map PEPD-OUTAGE permit 10
 set as-path prepend {asn} {asn} {asn}
!
route-map ACCEPT-NOTHING deny 10
!
",
        id = hub_lan(k),
    )
}

/// The router's zebra config.
pub fn router_zebra() -> String {
    "frr defaults traditional\nhostname rtr\n".to_owned()
}

/// The router's bgpd config: a passive session with each of `hubs` hubs.
pub fn router_bgpd(hubs: usize) -> String {
    let (keepalive, hold) = TIMERS;
    let mut s = format!(
        "frr defaults traditional
hostname rtr
router bgp {ROUTER_AS}
 bgp router-id {ROUTER}
 no bgp ebgp-requires-policy
"
    );
    for k in 1..=hubs {
        let n = hub_lan(k);
        s.push_str(&format!(
            " neighbor {n} remote-as {asn}
 neighbor {n} passive
 neighbor {n} timers {keepalive} {hold}
 neighbor {n} advertisement-interval 0
",
            asn = hub_as(k)
        ));
    }
    s
}

/// The one-sentence error when FRR is not installed.
pub fn require() -> Result<(), Error> {
    if Path::new(DAEMONS).join("bgpd").is_file() {
        Ok(())
    } else {
        Err(Error::Invalid(
            "FRR is not installed: the active-set scenario needs the Debian package frr \
             (scripts/install-frr.sh installs it without starting it)"
                .into(),
        ))
    }
}

/// zebra and bgpd running in one namespace, with their own run directory (pid files,
/// the zebra socket and the vty sockets); killed when dropped.
pub struct Frr {
    children: Vec<Child>,
    run_dir: PathBuf,
    logs: Vec<PathBuf>,
}

impl Frr {
    /// Writes `DIR/frr-NAME/{zebra,bgpd}.conf` and starts zebra, then bgpd, in `ns`.
    pub fn start(
        dir: &Path,
        ns: &str,
        name: &str,
        zebra_conf: &str,
        bgpd_conf: &str,
    ) -> Result<Frr, Error> {
        let run_dir = dir.join(format!("frr-{name}"));
        fs::create_dir_all(&run_dir)?;
        // The daemons drop to the frr user before they write pid files and sockets.
        let user = User::from_name(FRR_USER)
            .ok()
            .flatten()
            .ok_or_else(|| Error::Invalid("FRR's user `frr` does not exist".into()))?;
        let group = Group::from_name(FRR_USER).ok().flatten().map(|g| g.gid);
        chown(&run_dir, Some(user.uid), group)
            .map_err(|e| Error::Invalid(format!("chown {}: {e}", run_dir.display())))?;
        let mut frr = Frr {
            children: Vec::new(),
            run_dir: run_dir.clone(),
            logs: Vec::new(),
        };
        let zserv = run_dir.join("zserv.api");
        for (daemon, conf) in [("zebra", zebra_conf), ("bgpd", bgpd_conf)] {
            let conf_path = run_dir.join(format!("{daemon}.conf"));
            fs::write(&conf_path, conf)?;
            let log = run_dir.join(format!("{daemon}.log"));
            let mut cmd = command_in(ns, Path::new(DAEMONS).join(daemon));
            cmd.arg("-f")
                .arg(&conf_path)
                .arg("-i")
                .arg(run_dir.join(format!("{daemon}.pid")))
                .arg("-z")
                .arg(&zserv)
                .arg("--vty_socket")
                .arg(&run_dir)
                .args(["-u", FRR_USER, "-g", FRR_USER, "--log", "stdout"]);
            frr.children.push(spawn_logged(cmd, &log)?);
            frr.logs.push(log);
            if daemon == "zebra" {
                // bgpd gives up on a zebra socket that is not there yet only after retries;
                // waiting for it keeps the session's start prompt.
                wait_for_path(&zserv)?;
            }
        }
        Ok(frr)
    }

    /// SIGKILL to every daemon: no notification, no withdrawal.
    pub fn kill(&mut self) {
        for mut c in self.children.drain(..) {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.wait();
        }
    }

    /// Runs `vtysh -c COMMAND` against this instance's daemons and returns its output.
    pub fn vtysh(&self, ns: &str, command: &str) -> Result<String, Error> {
        let mut cmd = command_in(ns, "vtysh");
        cmd.arg("--vty_socket")
            .arg(&self.run_dir)
            .args(["-c", command]);
        let out = cmd.output().map_err(|source| Error::Spawn {
            cmd: format!("{cmd:?}"),
            source,
        })?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The end of each daemon's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let tails: Vec<String> = self.logs.iter().map(|l| file_tail(l, lines)).collect();
        tails.join("\n")
    }
}

impl Drop for Frr {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_for_path(path: &Path) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !path.exists() {
        if std::time::Instant::now() >= deadline {
            return Err(Error::Invalid(format!(
                "zebra never made its socket {}",
                path.display()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// The router's next hop for `prefix` now, from its kernel table (`None`: no route).
pub fn router_next_hop(ns: &str, prefix: &str) -> Result<Option<Ipv4Addr>, Error> {
    let out = crate::cmd::ip_in(ns, &["-4", "route", "show", prefix])?;
    Ok(out
        .split_whitespace()
        .skip_while(|w| *w != "via")
        .nth(1)
        .and_then(|a| a.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_advertises_its_tables_and_the_outage_table_less_preferred() {
        let c = hub_bgpd(2);
        assert!(c.contains("router bgp 65012\n bgp router-id 198.18.3.12\n"));
        assert!(c.contains(" neighbor 198.18.3.254 remote-as 65000\n"));
        assert!(c.contains("  redistribute table 200\n"));
        assert!(c.contains("  redistribute table 201 route-map PEPD-OUTAGE\n"));
        assert!(c.contains(" set as-path prepend 65012 65012 65012\n"));
        assert!(c.contains("  neighbor 198.18.3.254 route-map ACCEPT-NOTHING in\n"));
        assert_eq!(
            hub_zebra(2),
            "frr defaults traditional\nhostname h2\nip import-table 200\nip import-table 201\n"
        );
    }

    #[test]
    fn the_router_waits_for_every_hub() {
        let c = router_bgpd(3);
        for k in 1..=3 {
            let n = hub_lan(k);
            assert!(c.contains(&format!(" neighbor {n} remote-as {}\n", 65010 + k)));
            assert!(c.contains(&format!(" neighbor {n} passive\n")));
        }
        assert!(!c.contains("198.18.3.14"));
    }
}
