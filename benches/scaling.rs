//! Throughput and fairness of 1, 2, 4, 8 and 16 processes contending on
//! one name, printed as a markdown table.
//!
//! ```text
//! cargo bench --bench scaling
//! ```
//!
//! Each process (this binary, re-run) loops acquire → tiny critical section
//! → release on one name (`durable(false)`) between a start and a stop
//! time on `CLOCK_MONOTONIC`, passed as arguments, and prints how many
//! acquisitions it made. The waits use `acquire_timeout` up to the stop
//! time, so no child outlives it by more than one attempt; the parent
//! still kills (by pid) and reaps any child that overruns. Before each
//! configuration the bench waits until creating a file costs what it did
//! at its best (see `Settler`), so that one configuration's churn does not
//! slow the next.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold::Locker;
use nix::time::{ClockId, clock_gettime};

#[path = "support/settle.rs"]
mod settle;
use settle::Settler;

const ROLE: &str = "LEASEHOLD_BENCH_ROLE";
const PROCESSES: [usize; 5] = [1, 2, 4, 8, 16];
const RUN: Duration = Duration::from_secs(2);
/// Time for every child to start before the run begins.
const START_DELAY: Duration = Duration::from_millis(700);
/// How long past the stop time a child may take before it is killed.
const GRACE: Duration = Duration::from_secs(10);

/// CLOCK_MONOTONIC is one clock for every process on the machine.
fn now_ns() -> u64 {
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn main() {
    if std::env::var(ROLE).is_ok() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        contend(&args[0], args[1].parse().unwrap(), args[2].parse().unwrap());
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();

    println!(
        "\n{} s per configuration, one name, durable(false), each process: acquire -> tiny critical section -> release",
        RUN.as_secs()
    );
    println!(
        "| processes | acquisitions/s (total) | per process min / median / max | fairness min/max | coefficient of variation | disk attempts per acquisition |"
    );
    println!("|---|---|---|---|---|---|");
    let mut settler = Settler::new(dir.path());
    for n in PROCESSES {
        // Every configuration starts from the same filesystem state.
        settler.settle();
        let start = now_ns() + START_DELAY.as_nanos() as u64;
        let stop = start + RUN.as_nanos() as u64;
        let children: Vec<Child> = (0..n)
            .map(|_| {
                Command::new(std::env::current_exe().unwrap())
                    .args([d, &start.to_string(), &stop.to_string()])
                    .env(ROLE, "contend")
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let results: Vec<(u64, u64)> = children
            .into_iter()
            .map(|child| finish(child, stop + GRACE.as_nanos() as u64))
            .collect();
        let mut counts: Vec<f64> = results.iter().map(|r| r.0 as f64).collect();
        counts.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let total: f64 = counts.iter().sum();
        let attempts: u64 = results.iter().map(|r| r.1).sum();
        let mean = total / n as f64;
        let var = counts.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / n as f64;
        let (min, max) = (counts[0], counts[n - 1]);
        let median = (counts[(n - 1) / 2] + counts[n / 2]) / 2.0;
        println!(
            "| {n} | {:.0} | {min:.0} / {:.0} / {max:.0} | {:.3} | {:.2} | {:.2} |",
            total / RUN.as_secs_f64(),
            median,
            if max > 0.0 { min / max } else { 0.0 },
            if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
            if total > 0.0 { attempts as f64 / total } else { 0.0 },
        );
    }
}

/// Waits for `child` until `deadline_ns`, killing it (by pid) and reaping
/// it if it is still running then; returns its acquisitions and disk
/// attempts.
fn finish(mut child: Child, deadline_ns: u64) -> (u64, u64) {
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if now_ns() >= deadline_ns {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {} overran its stop time and was killed", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = child.wait().unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(status.success(), "child failed: {status}");
    let mut f = out.split_whitespace().map(|s| s.parse().unwrap());
    (f.next().unwrap(), f.next().unwrap())
}

fn contend(dir: &str, start: u64, stop: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let locker = Locker::builder().directory(dir).durable(false).build().unwrap();
        tokio::time::sleep(Duration::from_nanos(start.saturating_sub(now_ns()))).await;
        let mut count = 0u64;
        let mut critical = 0u64;
        loop {
            let now = now_ns();
            if now >= stop {
                break;
            }
            match locker
                .acquire_timeout("contended", Duration::from_nanos(stop - now))
                .await
            {
                Ok(guard) => {
                    // The tiny critical section.
                    critical = std::hint::black_box(critical + 1);
                    drop(guard);
                    count += 1;
                }
                Err(e) if e.is_timeout() => break,
                Err(e) => panic!("acquire failed: {e}"),
            }
        }
        assert_eq!(critical, count);
        println!("{count} {}", locker.stats().fs_attempts);
    });
}
