//! Shared by the benches that create files: waiting for the filesystem to
//! be as fast as it was at its best before each measurement.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The median cost of creating (exclusively) one of 101 new files in `dir`;
/// they are removed after.
pub fn create_cost(dir: &std::path::Path) -> Duration {
    let paths: Vec<_> = (0..101).map(|i| dir.join(format!("settle-{i}.probe"))).collect();
    let mut costs: Vec<Duration> = paths
        .iter()
        .map(|path| {
            let start = Instant::now();
            drop(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .unwrap(),
            );
            start.elapsed()
        })
        .collect();
    for path in &paths {
        std::fs::remove_file(path).unwrap();
    }
    costs.sort();
    costs[costs.len() / 2]
}

/// Waits between measurements until creating a file costs about what it
/// did at its best, so that every measurement starts from the same
/// filesystem state.
///
/// On ext4 without a journal (the root of the CI machine), the inode
/// allocator skips every inode of the group freed in the last
/// minute (six while its inode table block is still dirty), looking each
/// one up (`recently_deleted()`): after heavy create/unlink churn, ours or
/// another program's, each new file costs up to ~1.5 ms until that window
/// has passed. Waits at most a minute in all, then measures anyway, saying
/// so.
pub struct Settler {
    dir: std::path::PathBuf,
    best: Duration,
    budget: Duration,
}

impl Settler {
    pub fn new(dir: &std::path::Path) -> Self {
        Self {
            dir: dir.to_owned(),
            // A local disk creates a file in well under this.
            best: Duration::from_micros(30),
            budget: Duration::from_secs(60),
        }
    }

    pub fn settle(&mut self) {
        let started = Instant::now();
        loop {
            let cost = create_cost(&self.dir);
            self.best = self.best.min(cost);
            let waited = started.elapsed();
            if cost <= self.best * 2 + Duration::from_micros(10) {
                if waited > Duration::from_secs(1) {
                    println!(
                        "(waited {:.0} s for file creation to recover: now {cost:?} per create)",
                        waited.as_secs_f64()
                    );
                }
                return;
            }
            if waited >= self.budget {
                self.budget = Duration::ZERO;
                println!(
                    "WARNING: file creation costs {cost:?} (best seen {:?}); measuring anyway",
                    self.best
                );
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
            self.budget = self
                .budget
                .saturating_sub(Duration::from_secs(1).min(self.budget));
        }
    }
}
