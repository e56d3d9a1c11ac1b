//! Acquisitions of every kind (exclusive, shared, semaphore permits,
//! upgradable, and the upgrade and downgrade of an upgradable holding)
//! dropped at random points: by `tokio::time::timeout`, by `select!`
//! against a sleep, and by aborting their task. Meanwhile the number of
//! holders of each kind is counted (undercounted, if anything: a holder
//! counts from the moment its acquisition returns until just before its
//! guard is dropped) and must never exceed what the kind allows. Then
//! nothing may be left in the lock directory, and another process must
//! take every name at once.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use leasehold::{Locker, Strategy};

#[path = "support/reexec.rs"]
mod reexec;

/// The waiting line's file, which may stay in a lock directory.
const LINE_FILE: &str = "leasehold..line";

const PERMITS: u32 = 2;

/// The other process: takes every name of the directory `LH_DIR` (with
/// strategy `LH_STRATEGY`) at once, or exits 3 saying which it could not.
#[test]
fn child_process_entry() {
    let Ok(dir) = std::env::var("LH_DIR") else {
        return;
    };
    if let Ok(seed) = std::env::var("LH_MATRIX") {
        // A concurrent matrix of this process's own, logging to LH_LOG.
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(std::env::var("LH_LOG").unwrap())
            .unwrap();
        let _ = LOG.set(log);
        let strategy = std::env::var("LH_STRATEGY").unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(attempts(Path::new(&dir), &strategy, seed.parse().unwrap(), 900));
        std::process::exit(0);
    }
    let locker = locker(Path::new(&dir), &std::env::var("LH_STRATEGY").unwrap());
    let refused: Vec<String> = [
        ("x", "exclusive"),
        ("x", "shared"),
        ("x", "upgradable"),
        ("s", "permit"),
        ("s", "permit"),
    ]
    .iter()
    .filter_map(|&(name, kind)| {
        let got = match kind {
            "exclusive" => locker.blocking_try_acquire(name).map(|g| g.map(drop)),
            "shared" => locker.blocking_try_acquire_shared(name).map(|g| g.map(drop)),
            "permit" => locker
                .semaphore(name, PERMITS)
                .and_then(|s| s.blocking_try_acquire())
                .map(|g| g.map(drop)),
            _ => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(locker.try_acquire_upgradable(name))
                    .map(|g| g.map(drop))
            }
        };
        match got {
            Ok(Some(())) => None,
            other => Some(format!("{name} {kind}: {other:?}")),
        }
    })
    .collect();
    if !refused.is_empty() {
        eprintln!("refused: {refused:?}");
        std::process::exit(3);
    }
    std::process::exit(0);
}

fn locker(dir: &Path, strategy: &str) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(if strategy == "dir" {
            Strategy::Directory
        } else {
            Strategy::ExclusiveFile
        })
        .poll_interval(Duration::from_millis(2))
        .build()
        .unwrap()
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Holders of name `x` by kind, and of name `s`.
#[derive(Default)]
struct Counts {
    writers: AtomicI64,
    readers: AtomicI64,
    upgradables: AtomicI64,
    permits: AtomicI64,
    s_writers: AtomicI64,
    violations: AtomicU64,
}

impl Counts {
    fn check(&self) {
        let w = self.writers.load(Ordering::SeqCst);
        let r = self.readers.load(Ordering::SeqCst);
        let u = self.upgradables.load(Ordering::SeqCst);
        let p = self.permits.load(Ordering::SeqCst);
        let sw = self.s_writers.load(Ordering::SeqCst);
        let bad = w > 1
            || (w == 1 && (r > 0 || u > 0))
            || u > 1
            || p > i64::from(PERMITS)
            || sw > 1
            || (sw == 1 && p > 0);
        if bad {
            eprintln!("overlap: writers {w} readers {r} upgradables {u} permits {p} s-writers {sw}");
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The log shared by every process of a run: `+K` once a holder of kind
/// `K` has its lock, `-K` before it lets it go, appended (atomically) in
/// the order they happen.
static LOG: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();

fn log(line: &str) {
    use std::io::Write;
    if let Some(mut file) = LOG.get() {
        file.write_all(line.as_bytes()).unwrap();
    }
}

/// Counts one holder in `counter` until dropped.
struct Counted<'a>(&'a Counts, &'a AtomicI64);

impl<'a> Counted<'a> {
    fn new(counts: &'a Counts, counter: &'a AtomicI64) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        log(&format!("+{}\n", counts.letter(counter)));
        counts.check();
        Self(counts, counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        log(&format!("-{}\n", self.0.letter(self.1)));
        self.1.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Counts {
    fn letter(&self, counter: &AtomicI64) -> char {
        if std::ptr::eq(counter, &self.writers) {
            'W'
        } else if std::ptr::eq(counter, &self.readers) {
            'R'
        } else if std::ptr::eq(counter, &self.upgradables) {
            'U'
        } else if std::ptr::eq(counter, &self.permits) {
            'P'
        } else {
            'S'
        }
    }
}

/// Replays the log of every process: the first line at which holders
/// overlapped, if any.
fn replay(text: &str) -> Result<usize, String> {
    let counts = Counts::default();
    for (i, line) in text.lines().enumerate() {
        let (sign, letter) = line.split_at(1);
        let counter = match letter {
            "W" => &counts.writers,
            "R" => &counts.readers,
            "U" => &counts.upgradables,
            "P" => &counts.permits,
            _ => &counts.s_writers,
        };
        counter.fetch_add(if sign == "+" { 1 } else { -1 }, Ordering::SeqCst);
        counts.check();
        if counts.violations.load(Ordering::SeqCst) > 0 {
            return Err(format!("overlap at line {i} of the log"));
        }
    }
    Ok(text.lines().count())
}

/// One attempt of kind `kind`, holding what it gets for `hold`.
async fn attempt(locker: Locker, counts: Arc<Counts>, kind: u64, hold: Duration, limit: Duration) {
    let c = &*counts;
    match kind {
        0 => {
            if let Ok(Ok(g)) = tokio::time::timeout(limit, locker.acquire("x")).await {
                let _n = Counted::new(c, &c.writers);
                tokio::time::sleep(hold).await;
                drop(_n);
                drop(g);
            }
        }
        1 => {
            if let Ok(Ok(g)) = tokio::time::timeout(limit, locker.acquire_shared("x")).await {
                let _n = Counted::new(c, &c.readers);
                tokio::time::sleep(hold).await;
                drop(_n);
                drop(g);
            }
        }
        2 => {
            let sem = locker.semaphore("s", PERMITS).unwrap();
            if let Ok(Ok(g)) = tokio::time::timeout(limit, sem.acquire()).await {
                let _n = Counted::new(c, &c.permits);
                tokio::time::sleep(hold).await;
                drop(_n);
                drop(g);
            }
        }
        3 => {
            let got = tokio::select! {
                g = locker.acquire("s") => g.ok(),
                () = tokio::time::sleep(limit) => None,
            };
            if let Some(g) = got {
                let _n = Counted::new(c, &c.s_writers);
                tokio::time::sleep(hold).await;
                drop(_n);
                drop(g);
            }
        }
        _ => {
            let Ok(Ok(up)) = tokio::time::timeout(limit, locker.acquire_upgradable("x")).await else {
                return;
            };
            let n = Counted::new(c, &c.upgradables);
            tokio::time::sleep(hold / 2).await;
            // Counted until the upgrade starts: a cut-short upgrade lets the
            // holding go as its future is dropped, before we could say so.
            drop(n);
            let upgraded = tokio::time::timeout(limit, up.upgrade()).await;
            let Ok(Ok(writer)) = upgraded else {
                return;
            };
            let w = Counted::new(c, &c.writers);
            tokio::time::sleep(hold / 2).await;
            // Counted as a writer until the downgrade starts (readers may
            // come in before it returns).
            drop(w);
            let down = tokio::time::timeout(limit / 2, writer.downgrade()).await;
            if let Ok(Ok(up)) = down {
                let _n = Counted::new(c, &c.upgradables);
                tokio::time::sleep(hold / 4).await;
                drop(_n);
                drop(up);
            }
        }
    }
}

/// `rounds` attempts in this process, on three `Locker`s of `dir`.
async fn attempts(dir: &Path, strategy: &str, seed: u64, rounds: u32) {
    let lockers = [
        locker(dir, strategy),
        locker(dir, strategy),
        locker(dir, strategy),
    ];
    let counts = Arc::new(Counts::default());
    let mut rng = Rng(seed);
    let mut tasks = Vec::new();
    for _ in 0..rounds {
        let l = lockers[rng.below(3) as usize].clone();
        let kind = rng.below(5);
        let hold = Duration::from_micros(rng.below(1500));
        // Half cut short within a few milliseconds, half with time to win.
        let limit = if rng.below(2) == 0 {
            Duration::from_micros(rng.below(3000))
        } else {
            Duration::from_micros(5000 + rng.below(40_000))
        };
        let counts = Arc::clone(&counts);
        if rng.below(3) == 0 {
            // Aborted at a random point, held or not.
            let t = tokio::spawn(attempt(l, counts, kind, hold, Duration::from_secs(5)));
            let abort_after = Duration::from_micros(rng.below(4000));
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(abort_after).await;
                t.abort();
                let _ = t.await;
            }));
        } else {
            tasks.push(tokio::spawn(attempt(l, counts, kind, hold, limit)));
        }
        match rng.below(6) {
            0 => tokio::task::yield_now().await,
            1 => tokio::time::sleep(Duration::from_micros(rng.below(2000))).await,
            _ => {}
        }
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("an attempt hung")
            .unwrap();
    }
    assert_eq!(counts.violations.load(Ordering::SeqCst), 0, "holders overlapped");
}

async fn matrix(strategy: &str, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    attempts(dir.path(), strategy, seed, 600).await;

    // Cleanup that runs after the drop (release threads) ends promptly.
    let leftovers = || -> Vec<String> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != LINE_FILE)
            .collect()
    };
    for _ in 0..300 {
        if leftovers().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(leftovers().is_empty(), "left behind: {:?}", leftovers());

    let child = reexec::child_process()
        .env("LH_DIR", dir.path())
        .env("LH_STRATEGY", strategy)
        .output()
        .expect("the other process");
    assert!(
        child.status.success(),
        "another process could not take every name at once: {}",
        String::from_utf8_lossy(&child.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_of_every_kind_exclusive_file() {
    for seed in [1, 2] {
        matrix("file", seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_of_every_kind_directory() {
    for seed in [3, 4] {
        matrix("dir", seed).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn cancelled_acquisitions_of_every_kind_current_thread() {
    matrix("file", 5).await;
    matrix("dir", 6).await;
}

/// Three processes run the matrix at once on one directory; their shared
/// log must show no overlap, and nothing may be left.
fn across_processes(strategy: &str, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let locks = dir.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    let log_path = dir.path().join("log");
    std::fs::write(&log_path, b"").unwrap();
    let mut children: Vec<std::process::Child> = (0..3)
        .map(|i| {
            reexec::child_process()
                .env("LH_DIR", &locks)
                .env("LH_STRATEGY", strategy)
                .env("LH_MATRIX", (seed * 10 + i).to_string())
                .env("LH_LOG", &log_path)
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("a matrix process")
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut statuses = Vec::new();
    for child in &mut children {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                statuses.push(status);
                break;
            }
            if std::time::Instant::now() > deadline {
                for c in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                panic!("a matrix process hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(statuses.iter().all(|s| s.success()), "{statuses:?}");
    let text = std::fs::read_to_string(&log_path).unwrap();
    let lines = replay(&text).unwrap();
    assert!(lines > 150, "too few holdings to judge: {lines}");
    eprintln!("{lines} log lines");
    let leftovers: Vec<String> = std::fs::read_dir(&locks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != LINE_FILE)
        .collect();
    // A process that exits right after its last drop may leave a removal
    // that had to wait for a name's mutation lock to its release thread
    // (docs/guarantees.md, 5b): leftovers of a dead process, which must
    // not keep anyone from any name.
    let child = reexec::child_process()
        .env("LH_DIR", &locks)
        .env("LH_STRATEGY", strategy)
        .output()
        .expect("the other process");
    assert!(
        child.status.success(),
        "another process could not take every name at once (leftovers before: {leftovers:?}): {}",
        String::from_utf8_lossy(&child.stderr)
    );
    if !leftovers.is_empty() {
        eprintln!("leftovers of exited processes: {leftovers:?}");
    }
}

#[test]
fn cancelled_acquisitions_across_processes_exclusive_file() {
    across_processes("file", 7);
}

#[test]
fn cancelled_acquisitions_across_processes_directory() {
    across_processes("dir", 8);
}
