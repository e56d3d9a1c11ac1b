//! The one way leasehold reaches Tokio's blocking pool.
//!
//! Store operations block (syscalls that may sync to a disk, a server's
//! round trip), so an async method runs them with [`blocking`]. The
//! policy, the same for every caller:
//!
//! - inside a Tokio runtime, on its blocking pool, the result coming back
//!   over a channel, so that if the caller is dropped meanwhile, the result
//!   (say, a lock just taken) is dropped, and so released, right there;
//! - outside a runtime (a future polled by another executor, a guard
//!   released after the runtime is gone), inline: the caller's thread is
//!   then not a runtime worker, so blocking it holds up no one else.

use crate::error::{Error, Result};

/// Runs `f` where blocking is harmless (see the module docs).
///
/// # Errors
///
/// [`Error::Runtime`] when the runtime shuts down before `f` ran.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Ok(f());
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    runtime.spawn_blocking(move || {
        // If the receiver is gone, the value comes back and drops here.
        let _ = tx.send(f());
    });
    rx.await.map_err(|_| Error::Runtime {
        op: "run a lock operation on the blocking pool",
    })
}
