//! The backends the tortures (`tests/torture.rs`,
//! `tests/torture_shared.rs`) run on: both file strategies, and (feature
//! `postgres`) PostgreSQL.
#![allow(dead_code)]

use leasehold::Strategy;

/// The backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    ExclusiveFile,
    Directory,
    #[cfg(feature = "postgres")]
    Postgres,
}

impl Backend {
    pub const ALL: &[Backend] = &[
        Backend::ExclusiveFile,
        Backend::Directory,
        #[cfg(feature = "postgres")]
        Backend::Postgres,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Backend::ExclusiveFile => "file",
            Backend::Directory => "dir",
            #[cfg(feature = "postgres")]
            Backend::Postgres => "postgres",
        }
    }

    pub fn strategy(self) -> Option<Strategy> {
        match self {
            Backend::ExclusiveFile => Some(Strategy::ExclusiveFile),
            Backend::Directory => Some(Strategy::Directory),
            #[cfg(feature = "postgres")]
            Backend::Postgres => None,
        }
    }

    /// Whether a holder paused past its lease may be overtaken while it is
    /// paused: on files, yes (its lease is time); on a server, no (a paused holder's session keeps its lock
    /// on a server).
    pub fn leases_run_out_under_paused_holders(self) -> bool {
        self.strategy().is_some()
    }
}
