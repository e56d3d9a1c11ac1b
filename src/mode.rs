//! How a lock is held: exclusively, shared, or as one of a semaphore's
//! permits. A plain value at the bottom of the crate: records, owners,
//! errors and the backend contract all speak of it.

/// What kind of holding an acquisition asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Mode {
    /// One holder, nobody else.
    Exclusive,
    /// Any number of shared holders, no exclusive one.
    Shared,
    /// At most this many holders (a counting semaphore's permits).
    Permit(u32),
}

impl Mode {
    /// The name a record and a listing give this kind of holding.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Permit(_) => "semaphore",
        }
    }

    /// How this kind of holding reads in an error.
    pub(crate) fn describe(self) -> String {
        match self {
            Mode::Permit(1) => "a semaphore of 1 permit".to_owned(),
            Mode::Permit(n) => format!("a semaphore of {n} permits"),
            other => other.as_str().to_owned(),
        }
    }
}
