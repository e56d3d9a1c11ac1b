//! The clock the tests' processes share, to order what each logs.

/// A clock all processes share, in ns: `CLOCK_MONOTONIC` on Unix.
#[cfg(unix)]
pub fn mono_ns() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("clock_gettime");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// A clock all processes share, in ns: on Windows, where std offers no
/// monotonic clock comparable between processes, the system time
/// (`GetSystemTimePreciseAsFileTime`, 100 ns steps), which only a clock
/// adjustment during the run could move.
#[cfg(windows)]
pub fn mono_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64
}
