//! The renewal task that keeps a guard's lease alive.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::guard::{Lease, Step};

/// Renews one lease until it is released or lost.
///
/// Holds only a `Weak` to the lease, so a dropped guard ends it even if the
/// abort is never delivered (a runtime shutting down). Sleeps are computed
/// each round from the last outcome, which behaves like
/// `MissedTickBehavior::Delay`: a late wake-up renews once, never in a burst.
#[derive(Debug)]
pub(crate) struct Renewer {
    lease: Weak<Lease>,
    first: Duration,
}

impl Renewer {
    pub(crate) fn new(lease: &Arc<Lease>, interval: Duration) -> Self {
        Self {
            lease: Arc::downgrade(lease),
            first: interval,
        }
    }

    pub(crate) async fn run(self) {
        let mut wait = self.first;
        loop {
            tokio::time::sleep(wait).await;
            let Some(lease) = self.lease.upgrade() else {
                return;
            };
            // The renewal does file I/O: keep it off the runtime's workers.
            let step = tokio::task::spawn_blocking(move || lease.renew_once()).await;
            match step {
                Ok(Step::Again(next)) => wait = next,
                Ok(Step::Stop) | Err(_) => return,
            }
        }
    }
}
