//! The locks and atomics of the in-process machinery (the per-name queue,
//! the scope sets): std's, except in the model checks (`--cfg
//! leasehold_loom`, unit tests only), where they are `loom`'s, so that
//! `loom` can run every interleaving of the tasks that take them. Normal
//! builds get std's types themselves, at no cost.

#[cfg(all(test, leasehold_loom))]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(all(test, leasehold_loom))]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(all(test, leasehold_loom)))]
pub(crate) use std::sync::atomic::AtomicU64;
#[cfg(not(all(test, leasehold_loom)))]
pub(crate) use std::sync::{Mutex, MutexGuard};
