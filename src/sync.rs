//! The locks of the per-name queue: std's, except in the queue's model
//! checks (`--cfg leasehold_loom`, unit tests only), where they are
//! `loom`'s, so that `loom` can run every interleaving of the tasks that
//! take them. Normal builds get std's types themselves, at no cost.

#[cfg(all(test, leasehold_loom))]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(all(test, leasehold_loom)))]
pub(crate) use std::sync::{Mutex, MutexGuard};
