//! systemd readiness and status (`Type=notify`). Without NOTIFY_SOCKET every call is a no-op,
//! so the daemon behaves the same under systemd, in the testbed and by hand.

use tracing::debug;

#[derive(Clone, Copy, Default)]
pub struct Notifier;

impl Notifier {
    pub fn ready(&self, status: &str) {
        self.send(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(status),
        ]);
    }

    pub fn status(&self, status: &str) {
        self.send(&[sd_notify::NotifyState::Status(status)]);
    }

    pub fn watchdog(&self) {
        self.send(&[sd_notify::NotifyState::Watchdog]);
    }

    /// The watchdog period systemd expects pings within, if it set one for us.
    pub fn watchdog_period(&self) -> Option<std::time::Duration> {
        let mut usec = 0u64;
        sd_notify::watchdog_enabled(false, &mut usec)
            .then(|| std::time::Duration::from_micros(usec))
    }

    pub fn stopping(&self) {
        self.send(&[sd_notify::NotifyState::Stopping]);
    }

    fn send(&self, states: &[sd_notify::NotifyState]) {
        if let Err(e) = sd_notify::notify(false, states) {
            debug!(error = %e, "sd_notify failed");
        }
    }
}
