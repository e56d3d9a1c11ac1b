//! The staleness rules, judged on a fake host.

use super::*;
use crate::record::{Record, parse};
use std::collections::HashMap;
use std::time::UNIX_EPOCH;

struct Fake {
    now: SystemTime,
    boot_ms: u64,
    me: Identity,
    procs: HashMap<u64, Option<ProcStart>>,
    /// Time namespaces of pids, where not ours (`None`: unreadable).
    time_ns_of: HashMap<u64, Option<String>>,
    /// Whether `now - boot_ms` is when the machine booted.
    host_wide_boot: bool,
    /// `clock_ticks()`: `None` on a host without start ticks (the BSDs).
    hz: Option<u64>,
}

impl Host for Fake {
    fn now(&self) -> SystemTime {
        self.now
    }
    fn boot_clock_ms(&self) -> u64 {
        self.boot_ms
    }
    fn me(&self) -> &Identity {
        &self.me
    }
    fn probe(&self, pid: u64) -> Probe {
        if pid == 0 || pid > i32::MAX as u64 {
            Probe::Unknown
        } else if self.procs.contains_key(&pid) {
            Probe::Alive
        } else {
            Probe::Dead
        }
    }
    fn process_start(&self, pid: u64) -> Option<ProcStart> {
        self.procs.get(&pid).copied().flatten()
    }
    fn clock_ticks(&self) -> Option<u64> {
        self.hz
    }
    fn time_namespace_of(&self, pid: u64) -> Option<String> {
        match self.time_ns_of.get(&pid) {
            Some(ns) => ns.clone(),
            None => self.me.time_ns.clone(),
        }
    }
    fn boot_clock_is_host_wide(&self) -> bool {
        self.host_wide_boot
    }
}

const NOW_MS: u64 = 1_764_745_566_000;
const RULES: Rules = Rules {
    grace: Duration::from_secs(10),
    foreign_lease: Some(Duration::from_secs(120)),
};

fn fake() -> Fake {
    let mut procs = HashMap::new();
    // pid 100 started an hour ago; pid 200 started a second ago.
    procs.insert(
        100,
        Some(ProcStart {
            ticks: 1,
            epoch_ms: NOW_MS - 3_600_000,
            age_ms: 3_600_000,
        }),
    );
    procs.insert(
        200,
        Some(ProcStart {
            ticks: 2,
            epoch_ms: NOW_MS - 1_000,
            age_ms: 1_000,
        }),
    );
    procs.insert(300, None);
    // Started 5 s ago; its epoch start reads 20 s later than the wall
    // clock said when it started, because the clock stepped forward.
    procs.insert(
        400,
        Some(ProcStart {
            ticks: 4,
            epoch_ms: NOW_MS - 5_000,
            age_ms: 5_000,
        }),
    );
    Fake {
        now: UNIX_EPOCH + Duration::from_millis(NOW_MS),
        boot_ms: 50_000,
        me: Identity {
            pid: 1,
            hostname: "here".into(),
            start: None,
            start_time: None,
            boot_id: Some("boot-a".into()),
            pid_ns: Some("pid:[1]".into()),
            time_ns: Some("time:[1]".into()),
            machine_id: Some("machine-a".into()),
        },
        procs,
        time_ns_of: HashMap::new(),
        host_wide_boot: false,
        hz: Some(100),
    }
}

fn at(ms_ago: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(NOW_MS - ms_ago)
}

fn verdict(json: &str, mtime_ms_ago: u64, flock_free: Option<bool>) -> Verdict {
    let parsed = parse(json.as_bytes());
    let ev = Evidence {
        parsed: &parsed,
        mtime: at(mtime_ms_ago),
        flock_free,
        known_for: Duration::ZERO,
    };
    judge(&ev, RULES, &fake())
}

mod every_record;
mod fuzz;
mod leases;
mod owners;
