//! Many waiters and many held locks in one process, printed as markdown
//! tables.
//!
//! ```text
//! cargo bench --bench waiters
//! ```
//!
//! 1. *Waiting*: 1,000 and 10,000 tasks of one `Locker` wait on one name
//!    held by a second `Locker` of the same process. Measured: the memory
//!    per waiter (RSS from `/proc/self/statm` before and after spawning the
//!    waiters, over the count), the CPU the process uses while they all
//!    wait 2 s (`getrusage(RUSAGE_SELF)`), the disk attempts made meanwhile,
//!    the time from the holder's release until every waiter has had the
//!    lock once, and `stats().fs_waiters_max` (one filesystem waiter per
//!    name: must be 1). The same spawn pattern on a held
//!    `tokio::sync::Mutex` is the reference for what a waiting Tokio task
//!    costs by itself.
//! 2. *Held*: 10,000 distinct names held at once by one `Locker`
//!    (`durable(false)`): time to acquire them all (one after the other),
//!    memory per held lock, and time to release them all. Each held lock
//!    keeps a descriptor open, so `RLIMIT_NOFILE` is raised to its hard
//!    limit first; if that is below 10,500, as many locks as fit are taken
//!    and the output says so.
//!
//! Every measurement runs in a fresh child process (this binary, re-run),
//! so memory freed by one does not flatter the next, after waiting until
//! creating a file costs what it did at its best (see `Settler`). Children
//! are killed and reaped if they overrun.

#[cfg(unix)]
#[path = "support/settle.rs"]
mod settle;

#[cfg(unix)]
fn main() {
    unix::main();
}

#[cfg(not(unix))]
fn main() {
    println!("waiters: Unix only (it counts CPU time and descriptors with getrusage and getrlimit)");
}

#[cfg(unix)]
mod unix {

    use std::io::Read;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use leasehold::Locker;

    use super::settle::Settler;

    const ROLE: &str = "LEASEHOLD_BENCH_ROLE";
    const WAIT: Duration = Duration::from_secs(2);
    const HELD: usize = 10_000;
    /// Descriptors left for everything but the held locks.
    const FD_SPARE: u64 = 500;
    /// No child may run longer than this.
    const CHILD_LIMIT: Duration = Duration::from_secs(120);

    /// User + system CPU time of this process so far, in microseconds.
    fn cpu_us() -> i64 {
        use nix::sys::resource::{UsageWho, getrusage};
        let usage = getrusage(UsageWho::RUSAGE_SELF).unwrap();
        use nix::sys::time::TimeValLike;
        let us = |t: nix::sys::time::TimeVal| t.num_microseconds();
        us(usage.user_time()) + us(usage.system_time())
    }

    fn page_size() -> u64 {
        Command::new("getconf")
            .arg("PAGESIZE")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096)
    }

    /// Resident set size of this process, in bytes (`/proc/self/statm`).
    fn rss(page: u64) -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * page
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    pub(super) fn main() {
        if let Ok(role) = std::env::var(ROLE) {
            let args: Vec<String> = std::env::args().skip(1).collect();
            child(&role, &args);
            return;
        }
        if std::env::args().any(|a| a == "--list") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();

        println!("\nwaiting on one held name (one Locker's tasks; the holder is a second Locker)");
        println!(
            "| waiters | kind | all had it once after release | memory per waiter | CPU while waiting {} s | disk attempts while waiting | fs_waiters_max |",
            WAIT.as_secs()
        );
        println!("|---|---|---|---|---|---|---|");
        let mut settler = Settler::new(dir.path());
        for n in [1_000usize, 10_000] {
            for kind in ["leasehold", "tokio_mutex"] {
                settler.settle();
                let out = run_child("wait", &[kind, &n.to_string(), d]);
                let f: Vec<&str> = out.split_whitespace().collect();
                let (all_us, bytes, cpu_us, attempts, max, future): (f64, f64, f64, &str, &str, &str) = (
                    f[0].parse().unwrap(),
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3],
                    f[4],
                    f[5],
                );
                println!(
                    "| {n} | {} | {:.2} ms ({:.2} µs each) | {bytes:.0} B (future: {future} B) | {:.2} ms | {attempts} | {max} |",
                    if kind == "leasehold" {
                        "leasehold"
                    } else {
                        "`tokio::sync::Mutex` (reference)"
                    },
                    all_us / 1000.0,
                    all_us / n as f64,
                    cpu_us / 1000.0,
                );
            }
        }

        settler.settle();
        let out = run_child("held", &[d]);
        let f: Vec<&str> = out.split_whitespace().collect();
        let (count, limit, acq_us, bytes, rel_us): (f64, &str, f64, f64, f64) = (
            f[0].parse().unwrap(),
            f[1],
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
            f[4].parse().unwrap(),
        );
        let (first_us, last_us): (f64, f64) = (f[5].parse().unwrap(), f[6].parse().unwrap());
        println!("\ndistinct names held at once by one Locker (durable(false); RLIMIT_NOFILE {limit})");
        if (count as usize) < HELD {
            println!(
                "NOTE: RLIMIT_NOFILE allows only {count} held locks (each keeps a descriptor open), not {HELD}."
            );
        }
        println!(
            "| locks held | acquire all | per lock (first tenth / last tenth) | memory per held lock | release all | per lock |"
        );
        println!("|---|---|---|---|---|---|");
        println!(
            "| {count} | {:.1} ms | {:.1} µs ({first_us:.1} / {last_us:.1}) | {bytes:.0} B | {:.1} ms | {:.1} µs |",
            acq_us / 1000.0,
            acq_us / count,
            rel_us / 1000.0,
            rel_us / count,
        );
    }

    /// Runs this binary as a child in `role` and returns what it printed.
    fn run_child(role: &str, args: &[&str]) -> String {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(args)
            .env(ROLE, role)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + CHILD_LIMIT;
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if Instant::now() >= deadline {
                // `kill` signals exactly this child's pid; `wait` reaps it.
                let _ = child.kill();
                let _ = child.wait();
                panic!("child {role} {args:?} overran {CHILD_LIMIT:?} and was killed");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = child.wait().unwrap();
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert!(status.success(), "child {role} {args:?} failed: {status}");
        out
    }

    fn child(role: &str, args: &[String]) {
        match role {
            "wait" => {
                let n: usize = args[1].parse().unwrap();
                let dir = &args[2];
                match args[0].as_str() {
                    "leasehold" => wait_leasehold(n, dir),
                    _ => wait_mutex(n),
                }
            }
            "held" => held(&args[0]),
            _ => unreachable!("unknown role"),
        }
    }

    /// `n` tasks of one Locker wait on a name held by another Locker.
    fn wait_leasehold(n: usize, dir: &str) {
        let page = page_size();
        let rt = runtime();
        rt.block_on(async {
            let build = || Locker::builder().directory(dir).durable(false).build().unwrap();
            let holder = build();
            let waiters = build();
            // One allocation for all tasks, as the reference's Mutex is shared.
            let name: &'static str = Box::leak(format!("hot-{n}").into_boxed_str());
            let guard = holder.acquire(name).await.unwrap();
            // Warm up: the waiting Locker's watcher thread and the lock's queue
            // exist before the baseline is taken.
            assert!(
                waiters
                    .acquire_timeout(name, Duration::from_millis(20))
                    .await
                    .unwrap_err()
                    .is_timeout()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;

            let before = rss(page);
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let waiters = waiters.clone();
                    tokio::spawn(async move { drop(waiters.acquire(name).await.unwrap()) })
                })
                .collect();
            // Let every task run to its wait.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let per_waiter = rss(page).saturating_sub(before) as f64 / n as f64;

            let attempts = waiters.stats().fs_attempts;
            let cpu = cpu_us();
            tokio::time::sleep(WAIT).await;
            let cpu = cpu_us() - cpu;
            let attempts = waiters.stats().fs_attempts - attempts;

            let released = Instant::now();
            drop(guard);
            for t in tasks {
                t.await.unwrap();
            }
            let all = released.elapsed();
            let stats = waiters.stats();
            assert_eq!(stats.acquisitions, n as u64);
            // What each waiting task carries: its future's state machine.
            let future = std::mem::size_of_val(&waiters.acquire(name));
            println!(
                "{} {per_waiter} {cpu} {attempts} {} {future}",
                all.as_secs_f64() * 1e6,
                stats.fs_waiters_max
            );
        });
    }

    /// The reference: `n` tasks wait on a held `tokio::sync::Mutex`.
    fn wait_mutex(n: usize) {
        let page = page_size();
        let rt = runtime();
        rt.block_on(async {
            let mutex = std::sync::Arc::new(tokio::sync::Mutex::new(0u64));
            let guard = std::sync::Arc::clone(&mutex).lock_owned().await;
            tokio::time::sleep(Duration::from_millis(100)).await;

            let before = rss(page);
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let mutex = std::sync::Arc::clone(&mutex);
                    tokio::spawn(async move { *mutex.lock().await += 1 })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let per_waiter = rss(page).saturating_sub(before) as f64 / n as f64;

            let cpu = cpu_us();
            tokio::time::sleep(WAIT).await;
            let cpu = cpu_us() - cpu;

            let released = Instant::now();
            drop(guard);
            for t in tasks {
                t.await.unwrap();
            }
            let all = released.elapsed();
            assert_eq!(*mutex.lock().await, n as u64);
            let future = std::mem::size_of_val(&mutex.lock());
            println!("{} {per_waiter} {cpu} - - {future}", all.as_secs_f64() * 1e6);
        });
    }

    /// Raises the soft descriptor limit to the hard one and returns it.
    // `rlim_t` is `u64` on Linux and macOS but `i64` on FreeBSD.
    #[allow(clippy::useless_conversion)]
    fn raise_nofile() -> u64 {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let limit = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
            hard
        } else {
            soft
        };
        u64::try_from(limit).unwrap_or(0)
    }

    /// Many distinct names held at once.
    fn held(dir: &str) {
        let limit = raise_nofile();
        let count = HELD.min(usize::try_from(limit.saturating_sub(FD_SPARE)).unwrap_or(HELD));
        let page = page_size();
        let rt = runtime();
        rt.block_on(async {
            let locker = Locker::builder().directory(dir).durable(false).build().unwrap();
            // Warm up: the renewal thread and the first lock's allocations.
            drop(locker.acquire("warm-up").await.unwrap());
            let names: Vec<String> = (0..count).map(|i| format!("held-{i}")).collect();
            tokio::time::sleep(Duration::from_millis(100)).await;

            let before = rss(page);
            let started = Instant::now();
            let mut guards = Vec::with_capacity(count);
            // Per-lock time of the first and the last tenth, to show whether
            // the cost grows with the number held.
            let tenth = (count / 10).max(1);
            let mut first_tenth = Duration::ZERO;
            let mut mark = started;
            for (i, name) in names.iter().enumerate() {
                guards.push(locker.acquire(name).await.unwrap());
                if i + 1 == tenth {
                    first_tenth = started.elapsed();
                }
                if i + 1 == count - tenth {
                    mark = Instant::now();
                }
            }
            let last_tenth = mark.elapsed();
            let acquired = started.elapsed();
            let per_lock = rss(page).saturating_sub(before) as f64 / count as f64;

            let started = Instant::now();
            drop(guards);
            let released = started.elapsed();
            assert!(!locker.is_held("held-0").await.unwrap());
            println!(
                "{count} {limit} {} {per_lock} {} {} {}",
                acquired.as_secs_f64() * 1e6,
                released.as_secs_f64() * 1e6,
                first_tenth.as_secs_f64() * 1e6 / tenth as f64,
                last_tenth.as_secs_f64() * 1e6 / tenth as f64,
            );
        });
    }
}
