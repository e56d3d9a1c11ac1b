//! Throughput and fairness of 1, 2, 4, 8 and 16 processes contending on
//! one name, printed as a markdown table; then, each in a table of its
//! own with the same columns, 4 and 16 processes looping on a 1-permit
//! semaphore (`Locker::semaphore(name, 1)`, `Semaphore::acquire_timeout`)
//! and 4 and 16 processes looping `acquire_shared_timeout` on one name
//! (shared holders do not exclude each other: that table measures taking
//! and giving back a shared lock beside other readers, not a handoff),
//! and 4 and 16 processes looping `acquire_timeout` on `Locker`s built
//! with `fair(true)` (turns of one acquisition).
//!
//! ```text
//! cargo bench --bench scaling
//! ```
//!
//! `LEASEHOLD_BENCH_PROCESSES=4` (or `2,16`) runs only these process
//! counts; `LEASEHOLD_BENCH_KINDS=exclusive` (or `semaphore,shared`, any of
//! `exclusive`, `semaphore`, `shared`, `fair`, `py-filelock`) only these tables.
//!
//! Each configuration runs three times; the table gives the median run's
//! throughput and the worst run's fairness (least served process over
//! most served). py-filelock's `FileLock` runs the same loop in Python for
//! 4 and 16 processes when `python3 -c "import filelock"` works.
//!
//! Each process (this binary, re-run) loops acquire → tiny critical section
//! → release on one name (the defaults) between a start and a stop
//! time on `CLOCK_MONOTONIC`, passed as arguments, and prints how many
//! acquisitions it made. The waits use `acquire_timeout` up to the stop
//! time, so no child outlives it by more than one attempt; the parent
//! still kills (by pid) and reaps any child that overruns. Before each
//! configuration the bench waits until creating a file costs what it did
//! at its best (see `Settler`), so that one configuration's churn does not
//! slow the next.

#[cfg(unix)]
#[path = "support/settle.rs"]
mod settle;

#[cfg(unix)]
fn main() {
    unix::main();
}

#[cfg(not(unix))]
fn main() {
    println!("scaling: Unix only (its clock is CLOCK_MONOTONIC, shared by processes)");
}

#[cfg(unix)]
mod unix {

    use std::io::Read;
    use std::process::{Child, Command, Stdio};
    use std::time::Duration;

    use leasehold::Locker;
    use nix::time::{ClockId, clock_gettime};

    use super::settle::Settler;

    const ROLE: &str = "LEASEHOLD_BENCH_ROLE";
    const PROCESSES: [usize; 5] = [1, 2, 4, 8, 16];
    /// The process counts of the semaphore and shared tables.
    const KIND_PROCESSES: [usize; 2] = [4, 16];
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

    pub(super) fn main() {
        if let Ok(role) = std::env::var(ROLE) {
            let args: Vec<String> = std::env::args().skip(1).collect();
            let kind = match role.as_str() {
                "contend" => Kind::Exclusive,
                "contend-semaphore" => Kind::Semaphore,
                "contend-shared" => Kind::Shared,
                "contend-fair" => Kind::Fair,
                _ => unreachable!("unknown role"),
            };
            contend(kind, &args[0], args[1].parse().unwrap(), args[2].parse().unwrap());
            return;
        }
        if std::env::args().any(|a| a == "--list") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        // `LEASEHOLD_BENCH_KINDS=semaphore,shared`: only these tables.
        let kinds: Option<Vec<String>> = std::env::var("LEASEHOLD_BENCH_KINDS")
            .ok()
            .map(|list| list.split(',').map(|k| k.trim().to_owned()).collect());
        for kind in kinds.iter().flatten() {
            assert!(
                ["exclusive", "semaphore", "shared", "fair", "py-filelock"].contains(&kind.as_str()),
                "LEASEHOLD_BENCH_KINDS: unknown kind {kind:?}"
            );
        }
        let wanted = |kind: &str| kinds.as_ref().is_none_or(|kinds| kinds.iter().any(|k| k == kind));
        let mut settler = Settler::new(dir.path());
        // `LEASEHOLD_BENCH_PROCESSES=4` (or `2,16`): only these configurations.
        let only: Option<Vec<usize>> = std::env::var("LEASEHOLD_BENCH_PROCESSES").ok().map(|list| {
            list.split(',')
                .map(|n| n.trim().parse().expect("a process count"))
                .collect()
        });
        let contend_runs = |settler: &mut Settler, n: usize, role: &str| -> Vec<Run> {
            (0..REPEATS)
                .map(|_| {
                    // Every run starts from the same filesystem state.
                    settler.settle();
                    run(n, |start, stop| {
                        Command::new(std::env::current_exe().unwrap())
                            .args([d, &start.to_string(), &stop.to_string()])
                            .env(ROLE, role)
                            .stdout(Stdio::piped())
                            .spawn()
                            .unwrap()
                    })
                })
                .collect()
        };

        if wanted("exclusive") {
            println!(
                "\n{} s per configuration, run three times, one name, the defaults, each process: acquire -> tiny critical section -> release",
                RUN.as_secs()
            );
            table_head();
            for n in PROCESSES
                .into_iter()
                .filter(|n| only.as_ref().is_none_or(|only| only.contains(n)))
            {
                let runs = contend_runs(&mut settler, n, "contend");
                report(&n.to_string(), &runs);
            }
        }
        // The lock Python users pick, contended the same way (skipped without
        // python3's filelock module).
        if wanted("py-filelock") && python_has_filelock() {
            println!("\npy-filelock FileLock, the same loop in Python, in the same directory:\n");
            for n in [4, 16]
                .into_iter()
                .filter(|n| only.as_ref().is_none_or(|only| only.contains(n)))
            {
                let runs: Vec<Run> = (0..REPEATS)
                    .map(|_| {
                        settler.settle();
                        run(n, |start, stop| {
                            Command::new("python3")
                                .args(["-c", PY_CONTEND, d, &start.to_string(), &stop.to_string()])
                                .stdout(Stdio::piped())
                                .spawn()
                                .unwrap()
                        })
                    })
                    .collect();
                report(&format!("{n} (py-filelock)"), &runs);
            }
        }
        for (kind, role, what) in [
            (
                "semaphore",
                "contend-semaphore",
                "a 1-permit semaphore (`semaphore(name, 1)`, `Semaphore::acquire_timeout`)",
            ),
            (
                "shared",
                "contend-shared",
                "`acquire_shared_timeout` (shared holders overlap: no process waits for another's release)",
            ),
            (
                "fair",
                "contend-fair",
                "`acquire_timeout` on a `Locker` built with `fair(true)` (turns of one acquisition)",
            ),
        ] {
            let counts: Vec<usize> = KIND_PROCESSES
                .into_iter()
                .filter(|n| only.as_ref().is_none_or(|only| only.contains(n)))
                .collect();
            if !wanted(kind) || counts.is_empty() {
                continue;
            }
            println!(
                "\n{kind}: {} s per configuration, run three times, one name, the defaults, each process: {what} -> tiny critical section -> release\n",
                RUN.as_secs()
            );
            table_head();
            for n in counts {
                let runs = contend_runs(&mut settler, n, role);
                report(&format!("{n} ({kind})"), &runs);
            }
        }
    }

    fn table_head() {
        println!(
            "| processes | acquisitions/s (median run) | per process min / median / max (median run) | fairness min/max: worst (each run) | longest wait | disk attempts per acquisition |"
        );
        println!("|---|---|---|---|---|---|");
    }

    /// What each contending process acquires.
    #[derive(Clone, Copy)]
    enum Kind {
        /// `acquire_timeout` on one name.
        Exclusive,
        /// A permit of a 1-permit semaphore.
        Semaphore,
        /// `acquire_shared_timeout` on one name.
        Shared,
        /// `acquire_timeout` on one name, `fair(true)`.
        Fair,
    }

    /// Runs of each configuration: the table gives the median throughput and
    /// the worst fairness of these.
    const REPEATS: usize = 3;

    /// One run of `n` contending processes: each one's acquisitions, disk
    /// attempts and longest wait (µs).
    struct Run {
        counts: Vec<f64>,
        attempts: u64,
        longest_wait_us: u64,
    }

    fn run(n: usize, spawn: impl Fn(u64, u64) -> Child) -> Run {
        let start = now_ns() + START_DELAY.as_nanos() as u64;
        let stop = start + RUN.as_nanos() as u64;
        let children: Vec<Child> = (0..n).map(|_| spawn(start, stop)).collect();
        let results: Vec<(u64, u64, u64)> = children
            .into_iter()
            .map(|child| finish(child, stop + GRACE.as_nanos() as u64))
            .collect();
        let mut counts: Vec<f64> = results.iter().map(|r| r.0 as f64).collect();
        counts.sort_by(|a, b| a.partial_cmp(b).unwrap());
        Run {
            counts,
            attempts: results.iter().map(|r| r.1).sum(),
            longest_wait_us: results.iter().map(|r| r.2).max().unwrap_or(0),
        }
    }

    fn report(label: &str, runs: &[Run]) {
        let fairness = |r: &Run| {
            let (min, max) = (r.counts[0], r.counts[r.counts.len() - 1]);
            if max > 0.0 { min / max } else { 0.0 }
        };
        let mut rates: Vec<f64> = runs
            .iter()
            .map(|r| r.counts.iter().sum::<f64>() / RUN.as_secs_f64())
            .collect();
        rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let worst = runs.iter().map(fairness).fold(f64::INFINITY, f64::min);
        let each: Vec<String> = runs.iter().map(|r| format!("{:.2}", fairness(r))).collect();
        let median_run = &runs[runs.len() / 2];
        let n = median_run.counts.len();
        let total: f64 = runs.iter().map(|r| r.counts.iter().sum::<f64>()).sum();
        let attempts: u64 = runs.iter().map(|r| r.attempts).sum();
        let longest = runs.iter().map(|r| r.longest_wait_us).max().unwrap_or(0);
        println!(
            "| {label} | {:.0} | {:.0} / {:.0} / {:.0} | **{worst:.2}** ({}) | {:.1} ms | {:.2} |",
            rates[rates.len() / 2],
            median_run.counts[0],
            median_run.counts[(n - 1) / 2],
            median_run.counts[n - 1],
            each.join(", "),
            longest as f64 / 1000.0,
            if total > 0.0 { attempts as f64 / total } else { 0.0 },
        );
    }

    fn python_has_filelock() -> bool {
        Command::new("python3")
            .args(["-c", "import filelock"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The contending loop in Python with py-filelock: same start and stop
    /// times on CLOCK_MONOTONIC, same output (acquisitions, attempts as 0,
    /// longest wait in µs).
    const PY_CONTEND: &str = r#"
import os, sys, time, filelock
d, start, stop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lock = filelock.FileLock(os.path.join(d, "py-contended.lock"))
now = lambda: time.clock_gettime_ns(time.CLOCK_MONOTONIC)
time.sleep(max(0, start - now()) / 1e9)
count, longest = 0, 0
while now() < stop:
    t = now()
    lock.acquire()
    count += 1
    lock.release()
    longest = max(longest, now() - t)
print(count, 0, longest // 1000)
"#;

    /// Waits for `child` until `deadline_ns`, killing it (by pid) and reaping
    /// it if it is still running then; returns its acquisitions, disk
    /// attempts and longest wait (µs).
    fn finish(mut child: Child, deadline_ns: u64) -> (u64, u64, u64) {
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
        (f.next().unwrap(), f.next().unwrap(), f.next().unwrap())
    }

    fn contend(kind: Kind, dir: &str, start: u64, stop: u64) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let locker = Locker::builder()
                .directory(dir)
                .fair(matches!(kind, Kind::Fair))
                .build()
                .unwrap();
            let semaphore = locker.semaphore("contended-semaphore", 1).unwrap();
            tokio::time::sleep(Duration::from_nanos(start.saturating_sub(now_ns()))).await;
            let mut count = 0u64;
            let mut critical = 0u64;
            let mut longest = 0u64;
            loop {
                let now = now_ns();
                if now >= stop {
                    break;
                }
                let timeout = Duration::from_nanos(stop - now);
                let acquired = match kind {
                    Kind::Exclusive | Kind::Fair => locker.acquire_timeout("contended", timeout).await,
                    Kind::Semaphore => semaphore.acquire_timeout(timeout).await,
                    Kind::Shared => locker.acquire_shared_timeout("contended-shared", timeout).await,
                };
                match acquired {
                    Ok(guard) => {
                        longest = longest.max(now_ns() - now);
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
            println!("{count} {} {}", locker.stats().fs_attempts, longest / 1000);
        });
    }
}
