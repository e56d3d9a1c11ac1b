//! Cross-process figures that criterion's sampling does not fit: handoff
//! latency between two processes (median and 99th percentile) against the
//! inotify wake-up floor and against a raw lock-file handoff (the same
//! turns with nothing but `O_EXCL` create, `flock`, write and `unlink`,
//! woken by inotify), and the CPU a waiting process burns.
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
        let raw = handoff_latency(d, "rawpong");
        let handoff = handoff_latency(d, "pingpong");
        let (waiting_cpu, idle_cpu) = waiting_cpu(d);

        println!(
            "\ncross-process figures ({ROUNDS} inotify wake-ups; {} of {ROUNDS} acquisitions were handoffs to a waiting process)",
            handoff.2
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
            "| CPU of a process waiting 5 s for a held lock | {waiting_cpu} ms (a process that does not wait: {idle_cpu} ms) | |"
        );
    }

    fn percentiles(mut us: Vec<f64>) -> (f64, f64) {
        us.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (us[us.len() / 2], us[us.len() * 99 / 100])
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

    /// Two processes take turns; each acquisition is paired with the other
    /// process's release just before it. Only acquisitions that had started
    /// waiting before that release count: an acquirer that arrived after it
    /// measures its own schedule, not the handoff.
    fn handoff_latency(dir: &str, role: &str) -> (f64, f64, usize) {
        let mut a = spawn(role, dir);
        let mut b = spawn(role, dir);
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
        let mut latencies = Vec::new();
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
                        latencies.push((t - r) as f64 / 1000.0);
                    }
                }
            }
        }
        assert!(
            latencies.len() >= ROUNDS / 2,
            "only {} of {ROUNDS} acquisitions were handoffs to a waiting process",
            latencies.len()
        );
        let count = latencies.len();
        let (median, p99) = percentiles(latencies);
        (median, p99, count)
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
            "pingpong" => rt.block_on(async {
                let locker = Locker::builder()
                    .directory(dir)
                    .durable(false)
                    .poll_interval(Duration::from_secs(1))
                    .build()
                    .unwrap();
                let mut out = String::new();
                for _ in 0..ROUNDS / 2 {
                    out.push_str(&format!("W {}\n", now_ns()));
                    let g = locker.acquire("pingpong").await.unwrap();
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
