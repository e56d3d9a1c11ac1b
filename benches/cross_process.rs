//! Cross-process figures that criterion's sampling does not fit: handoff
//! latency between two processes (median and 99th percentile) against the
//! inotify wake-up floor and against a raw lock-file handoff (the same
//! turns with nothing but `O_EXCL` create, `flock`, write and `unlink`,
//! woken by inotify), and the CPU a waiting process burns.
//!
//! The handoff rows, all from one run so their ratios are too:
//!
//! - exclusive: both processes take turns in `acquire`;
//! - shared → exclusive: process A takes the name with `acquire_shared`,
//!   process B with `acquire`; the row is a shared holder's release → B,
//!   waiting exclusively, holding it (two shared holders would not wait
//!   for each other, so a shared-only turn-taking measures nothing);
//! - exclusive → shared: the other direction of the same run, B's
//!   exclusive release → A, waiting in `acquire_shared`, holding it;
//! - semaphore: both take turns on a 1-permit `Locker::semaphore`
//!   (`Semaphore::acquire`), a permit's release → the other holding one.
//!
//! ```text
//! cargo bench --bench cross_process
//! ```
//!
//! The bench re-runs its own binary as the child processes.
//!
//! Linux only: its floors are inotify's.

#[cfg(target_os = "linux")]
fn main() {
    linux::main();
}

#[cfg(not(target_os = "linux"))]
fn main() {
    println!("cross_process: Linux only (its floors are inotify's)");
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use leasehold::Locker;
    use nix::time::{ClockId, clock_gettime};

    const ROLE: &str = "LEASEHOLD_BENCH_ROLE";
    const ROUNDS: usize = 400;

    /// CLOCK_MONOTONIC is one clock for every process on the machine.
    fn now_ns() -> u64 {
        let t = clock_gettime(ClockId::CLOCK_MONOTONIC).unwrap();
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    }

    /// User + system CPU time of this process so far, in microseconds.
    fn cpu_us() -> i64 {
        use nix::sys::resource::{UsageWho, getrusage};
        let usage = getrusage(UsageWho::RUSAGE_SELF).unwrap();
        use nix::sys::time::TimeValLike;
        let us = |t: nix::sys::time::TimeVal| t.num_microseconds();
        us(usage.user_time()) + us(usage.system_time())
    }

    pub fn main() {
        if let Ok(role) = std::env::var(ROLE) {
            let dir = std::env::args().nth(1).unwrap();
            child(&role, &dir);
            return;
        }
        if std::env::args().any(|a| a == "--list") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();

        let floor = inotify_floor(d);
        let raw = summary(handoff_latency(d, ["rawpong"; 2]).concat());
        let handoff = summary(handoff_latency(d, ["pingpong"; 2]).concat());
        // Process 0 takes the name shared, process 1 exclusively: each list
        // holds the handoffs to that process.
        let [to_shared, to_exclusive] = handoff_latency(d, ["sharedpong-shared", "sharedpong-exclusive"]);
        let (to_shared, to_exclusive) = (summary(to_shared), summary(to_exclusive));
        let semaphore = summary(handoff_latency(d, ["sempong"; 2]).concat());
        let (waiting_cpu, idle_cpu) = waiting_cpu(d);

        println!(
            "\ncross-process figures ({ROUNDS} inotify wake-ups; of {ROUNDS} acquisitions, handoffs to a waiting process: exclusive {}, shared -> exclusive {} and exclusive -> shared {} of one run, semaphore {})",
            handoff.2, to_exclusive.2, to_shared.2, semaphore.2
        );
        println!("| scenario | median | p99 |");
        println!("|---|---|---|");
        println!(
            "| inotify wake-up floor (unlink -> waiter woken) | {:.0} µs | {:.0} µs |",
            floor.0, floor.1
        );
        println!(
            "| raw lock-file handoff floor (unlink -> O_EXCL create + flock + write, one wake-up) | {:.0} µs | {:.0} µs |",
            raw.0, raw.1
        );
        println!(
            "| leasehold handoff (release -> other process holds) | {:.0} µs | {:.0} µs |",
            handoff.0, handoff.1
        );
        println!(
            "| leasehold shared -> exclusive handoff (a shared holder's release -> the other process, waiting in `acquire`, holds) | {:.0} µs | {:.0} µs |",
            to_exclusive.0, to_exclusive.1
        );
        println!(
            "| leasehold exclusive -> shared handoff (same run: an exclusive release -> the other process, waiting in `acquire_shared`, holds) | {:.0} µs | {:.0} µs |",
            to_shared.0, to_shared.1
        );
        println!(
            "| leasehold semaphore handoff, 1 permit (release -> the other process, waiting in `Semaphore::acquire`, holds a permit) | {:.0} µs | {:.0} µs |",
            semaphore.0, semaphore.1
        );
        println!(
            "| CPU of a process waiting 5 s for a held lock | {waiting_cpu} ms (a process that does not wait: {idle_cpu} ms) | |"
        );
    }

    fn percentiles(mut us: Vec<f64>) -> (f64, f64) {
        us.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (us[us.len() / 2], us[us.len() * 99 / 100])
    }

    /// Median, 99th percentile and count of one row's handoffs.
    fn summary(latencies: Vec<f64>) -> (f64, f64, usize) {
        assert!(
            latencies.len() >= ROUNDS / 4,
            "only {} handoffs to a waiting process for a row",
            latencies.len()
        );
        let count = latencies.len();
        let (median, p99) = percentiles(latencies);
        (median, p99, count)
    }

    fn spawn(role: &str, dir: &str) -> std::process::Child {
        Command::new(std::env::current_exe().unwrap())
            .arg(dir)
            .env(ROLE, role)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn lines(child: &mut std::process::Child) -> Vec<String> {
        BufReader::new(child.stdout.take().unwrap())
            .lines()
            .map(Result::unwrap)
            .collect()
    }

    /// Two processes (`roles[0]` and `roles[1]`) take turns; each
    /// acquisition is paired with the other process's release just before
    /// it. Only acquisitions that had started waiting before that release
    /// count: an acquirer that arrived after it measures its own schedule,
    /// not the handoff. Returns the handoffs to each process (µs).
    fn handoff_latency(dir: &str, roles: [&str; 2]) -> [Vec<f64>; 2] {
        let mut a = spawn(roles[0], dir);
        let mut b = spawn(roles[1], dir);
        let mut events: Vec<(u64, char, u32)> = Vec::new();
        for (child, id) in [(&mut a, 0), (&mut b, 1)] {
            for line in lines(child) {
                let (kind, t) = line.split_once(' ').unwrap();
                events.push((t.parse().unwrap(), kind.chars().next().unwrap(), id));
            }
        }
        a.wait().unwrap();
        b.wait().unwrap();
        events.sort();
        let mut last_release: Option<(u64, u32)> = None;
        let mut waiting_since = [None::<u64>; 2];
        let mut latencies = [Vec::new(), Vec::new()];
        for (t, kind, who) in events {
            match kind {
                'W' => waiting_since[who as usize] = Some(t),
                'R' => last_release = Some((t, who)),
                _ => {
                    let since = waiting_since[who as usize].take();
                    if let Some((r, by)) = last_release.take()
                        && by != who
                        && since.is_some_and(|w| w < r)
                    {
                        latencies[who as usize].push((t - r) as f64 / 1000.0);
                    }
                }
            }
        }
        let count = latencies[0].len() + latencies[1].len();
        assert!(
            count >= ROUNDS / 2,
            "only {count} of {ROUNDS} acquisitions were handoffs to a waiting process ({roles:?})"
        );
        latencies
    }

    /// Time from one process unlinking a file to another being woken by inotify.
    fn inotify_floor(dir: &str) -> (f64, f64) {
        let mut child = spawn("inotify", dir);
        let out = lines(&mut child);
        child.wait().unwrap();
        percentiles(out.iter().map(|l| l.parse::<f64>().unwrap()).collect())
    }

    fn waiting_cpu(dir: &str) -> (String, String) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let locker = Locker::new(dir).unwrap();
        let guard = rt.block_on(locker.acquire("held")).unwrap();
        let mut waiter = spawn("wait5", dir);
        let mut idle = spawn("idle", dir);
        std::thread::sleep(Duration::from_secs(5));
        drop(guard);
        let w = lines(&mut waiter).join("");
        let i = lines(&mut idle).join("");
        waiter.wait().unwrap();
        idle.wait().unwrap();
        (w, i)
    }

    fn child(role: &str, dir: &str) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        match role {
            "pingpong" | "sharedpong-shared" | "sharedpong-exclusive" | "sempong" => rt.block_on(async {
                let locker = Locker::builder()
                    .directory(dir)
                    .durable(false)
                    .poll_interval(Duration::from_secs(1))
                    .build()
                    .unwrap();
                let semaphore = locker.semaphore("sempong", 1).unwrap();
                let mut out = String::new();
                for _ in 0..ROUNDS / 2 {
                    out.push_str(&format!("W {}\n", now_ns()));
                    let g = match role {
                        "pingpong" => locker.acquire("pingpong").await,
                        "sharedpong-shared" => locker.acquire_shared("sharedpong").await,
                        "sharedpong-exclusive" => locker.acquire("sharedpong").await,
                        _ => semaphore.acquire().await,
                    }
                    .unwrap();
                    out.push_str(&format!("A {}\n", now_ns()));
                    // Held longer than the pause below, so the other process
                    // is already waiting when this one releases.
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    let t = now_ns();
                    drop(g);
                    out.push_str(&format!("R {t}\n"));
                    // Let the other process, which is waiting, take it.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                print!("{out}");
            }),
            "rawpong" => raw_pingpong(dir),
            "inotify" => {
                use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
                let ino = Inotify::init(InitFlags::IN_CLOEXEC).unwrap();
                ino.add_watch(dir, AddWatchFlags::IN_DELETE).unwrap();
                let path = std::path::Path::new(dir).join("floor");
                let (tx, rx) = std::sync::mpsc::channel::<u64>();
                let unlinker = std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for _ in 0..ROUNDS {
                        std::fs::write(&path, b"x").unwrap();
                        std::thread::sleep(Duration::from_millis(1));
                        let t = now_ns();
                        std::fs::remove_file(&path).unwrap();
                        let woke = rx.recv().unwrap();
                        out.push((woke - t) as f64 / 1000.0);
                    }
                    out
                });
                for _ in 0..ROUNDS {
                    ino.read_events().unwrap();
                    tx.send(now_ns()).unwrap();
                }
                for us in unlinker.join().unwrap() {
                    println!("{us}");
                }
            }
            "wait5" => rt.block_on(async {
                let locker = Locker::new(dir).unwrap();
                // The first attempt starts the watcher thread; count from after it.
                assert!(locker.try_acquire("held").await.unwrap().is_none());
                let before = cpu_us();
                drop(locker.acquire("held").await.unwrap());
                print!("{:.1}", (cpu_us() - before) as f64 / 1000.0);
            }),
            "idle" => rt.block_on(async {
                let locker = Locker::new(dir).unwrap();
                drop(locker.acquire("free").await.unwrap());
                let before = cpu_us();
                tokio::time::sleep(Duration::from_secs(5)).await;
                print!("{:.1}", (cpu_us() - before) as f64 / 1000.0);
            }),
            _ => unreachable!("unknown role"),
        }
    }

    /// `pingpong` with the least a lock file needs: an `O_EXCL` create, a
    /// `flock` and a record of leasehold's size to take it, an `unlink` to
    /// give it back, and a blocking inotify read (one wake-up) to wait.
    fn raw_pingpong(dir: &str) {
        use std::fs::{File, OpenOptions};
        use std::io::ErrorKind;
        use std::os::unix::fs::{FileExt, OpenOptionsExt};

        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

        let ino = Inotify::init(InitFlags::IN_CLOEXEC).unwrap();
        // Watched before the first attempt, so no release goes unseen; events
        // of earlier releases only cost a retry.
        ino.add_watch(dir, AddWatchFlags::IN_DELETE).unwrap();
        let path = std::path::Path::new(dir).join("rawpong.lock");
        let record = [b'x'; 491];
        let mut out = String::new();
        for _ in 0..ROUNDS / 2 {
            out.push_str(&format!("W {}\n", now_ns()));
            let file: File = loop {
                match OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                {
                    Ok(file) => break file,
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => drop(ino.read_events().unwrap()),
                    Err(e) => panic!("{e}"),
                }
            };
            file.try_lock().unwrap();
            file.write_all_at(&record, 0).unwrap();
            out.push_str(&format!("A {}\n", now_ns()));
            std::thread::sleep(Duration::from_millis(3));
            let t = now_ns();
            std::fs::remove_file(&path).unwrap();
            drop(file);
            out.push_str(&format!("R {t}\n"));
            std::thread::sleep(Duration::from_millis(1));
        }
        print!("{out}");
    }
}
