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

    pub fn stopping(&self) {
        self.send(&[sd_notify::NotifyState::Stopping]);
    }

    fn send(&self, states: &[sd_notify::NotifyState]) {
        if let Err(e) = sd_notify::notify(false, states) {
            debug!(error = %e, "sd_notify failed");
        }
    }
}
