//! Shared by the integration tests: real child processes, each started by
//! re-running the test binary with a role, bounded in time, and killed by
//! pid when the test is done with it.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

#[path = "clock.rs"]
pub mod clock;
#[path = "reexec.rs"]
pub mod reexec;
#[path = "stderr_tap.rs"]
pub mod stderr_tap;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use stderr_tap::StderrTap;

use leasehold::Locker;
#[cfg(unix)]
use nix::sys::signal::{Signal, kill};
#[cfg(unix)]
use nix::unistd::Pid;

const ROLE_ENV: &str = "LEASEHOLD_TEST_ROLE";
const STRATEGY_ENV: &str = "LEASEHOLD_TEST_STRATEGY";
/// Set in a child's environment to build its lockers with `PathStyle::Plain`
/// (`<name>.lock`, as pi-research names its lock files).
pub const PLAIN_ENV: &str = "LEASEHOLD_TEST_PLAIN";
/// Set in a child's environment to build its lockers with fencing on.
pub const FENCING_ENV: &str = "LEASEHOLD_TEST_FENCING";
/// Set (to anything) in a child's environment: its lockers are built with
/// `fair(true)`.
pub const FAIR_ENV: &str = "LEASEHOLD_TEST_FAIR";
const ARGS_ENV: &str = "LEASEHOLD_TEST_ARGS";
/// No child outlives this, whatever the parent does.
const CHILD_TTL: Duration = Duration::from_secs(90);

/// Call from a `#[test] fn child_process_entry()` in every test file that
/// starts children: a no-op in a normal run, the child's main in a child.
pub fn child_entry() {
    child_entry_with(|role, args| async move { run_role(&role, &args).await });
}

/// Like [`child_entry`], for a test file with roles of its own: `roles`
/// runs the child's role (given its name and arguments) and returns its
/// exit code; it may hand roles it does not know to [`run_role`].
pub fn child_entry_with<F, Fut>(roles: F)
where
    F: FnOnce(String, Vec<String>) -> Fut,
    Fut: std::future::Future<Output = i32>,
{
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let args: Vec<String> = std::env::var(ARGS_ENV)
        .unwrap_or_default()
        .split('\u{1f}')
        .map(str::to_owned)
        .collect();
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_TTL);
        std::process::exit(3);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let code = rt.block_on(roles(role, args));
    std::process::exit(code);
}

/// A child's message to the parent, read by [`ChildProc::expect`].
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "@@{line}");
    let _ = out.flush();
}

/// The layouts this platform has: both on Unix; on Windows, which cannot
/// lock a directory, the file layout only (`build()` refuses the other
/// with `Error::Unsupported`).
pub fn strategies() -> &'static [leasehold::Strategy] {
    if cfg!(windows) {
        &[leasehold::Strategy::ExclusiveFile]
    } else {
        &[leasehold::Strategy::ExclusiveFile, leasehold::Strategy::Directory]
    }
}

/// In a child: the strategy its parent gave [`ChildProc::spawn_with`].
pub fn strategy_from_env() -> leasehold::Strategy {
    match std::env::var(STRATEGY_ENV).as_deref() {
        Ok("dir") => leasehold::Strategy::Directory,
        _ => leasehold::Strategy::ExclusiveFile,
    }
}

/// In a child: `PathStyle::Plain` if its parent set [`PLAIN_ENV`].
pub fn path_style_from_env() -> leasehold::PathStyle {
    if std::env::var_os(PLAIN_ENV).is_some() {
        leasehold::PathStyle::Plain
    } else {
        leasehold::PathStyle::Hashed
    }
}

fn locker(dir: &str, lease_ms: u64, poll_ms: u64) -> Locker {
    let strategy = strategy_from_env();
    Locker::builder()
        .directory(dir)
        .path_style(path_style_from_env())
        .fencing(std::env::var_os(FENCING_ENV).is_some())
        .fair(std::env::var_os(FAIR_ENV).is_some())
        .strategy(strategy)
        .lease(Duration::from_millis(lease_ms))
        .poll_interval(Duration::from_millis(poll_ms))
        .build()
        .expect("locker")
}

/// Appends `line` to the log at `path`: one `write(2)` per line on an
/// `O_APPEND` descriptor (on Windows, in [`append_turn`]).
pub fn append(path: &str, line: &str) {
    let _turn = append_turn(Path::new(path));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .expect("open log");
    f.write_all(format!("{line}\n").as_bytes()).expect("append");
}

/// On Windows, a turn to append to `log`, held until the returned handle
/// closes: a whole-file lock on `<log>.lock`. Windows appends through a
/// `FILE_APPEND_DATA` handle atomically, but Wine 8 writes at the end of
/// file as it last saw it, so two processes appending at once may
/// overwrite each other's line. (Closed, not unlocked: Wine's
/// `File::unlock` of such a lock fails.) Nothing on Unix, where
/// `O_APPEND` writes are atomic.
pub fn append_turn(log: &Path) -> Option<std::fs::File> {
    if cfg!(unix) {
        return None;
    }
    let mut name = log.as_os_str().to_owned();
    name.push(".lock");
    let turn = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(name)
        .expect("open the log's lock");
    turn.lock().expect("lock the log");
    Some(turn)
}

/// The roles every test file's children can play.
pub async fn run_role(role: &str, args: &[String]) -> i32 {
    let pid = std::process::id();
    match role {
        // dir name rounds log: enter and leave a critical section, logging both.
        "contend" => {
            let l = locker(&args[0], 10_000, 2);
            let rounds: u32 = args[2].parse().unwrap();
            for i in 0..rounds {
                let g = l.acquire(&args[1]).await.expect("acquire");
                append(&args[3], &format!("S {pid} {i}"));
                std::thread::sleep(Duration::from_micros(300));
                append(&args[3], &format!("E {pid} {i}"));
                drop(g);
                tokio::time::sleep(Duration::from_micros(u64::from(pid % 7) * 300)).await;
            }
            0
        }
        // dir name millis log go: says "ready", then once the file `go`
        // exists, takes and drops the lock as fast as possible for
        // `millis`, logging each turn.
        "loop" => {
            let l = locker(&args[0], 10_000, 2);
            say("ready");
            while !std::path::Path::new(&args[4]).exists() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let end = std::time::Instant::now() + Duration::from_millis(args[2].parse().unwrap());
            while std::time::Instant::now() < end {
                let g = l.acquire(&args[1]).await.expect("acquire");
                append(&args[3], &format!("{pid}"));
                drop(g);
            }
            0
        }
        // dir name n counter: read-modify-write a counter under the lock.
        "count" => {
            let l = locker(&args[0], 10_000, 2);
            let n: u32 = args[2].parse().unwrap();
            for _ in 0..n {
                let g = l.acquire(&args[1]).await.expect("acquire");
                let v: u64 = std::fs::read_to_string(&args[3])
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                std::fs::write(&args[3], format!("{}", v + 1)).expect("write counter");
                drop(g);
            }
            0
        }
        // dir name lease_ms: take the lock and keep it until killed.
        "hold" => {
            let l = locker(&args[0], args[2].parse().unwrap(), 10);
            let g = l.acquire(&args[1]).await.expect("acquire");
            say(&format!("acquired {}", g.fencing_token().unwrap_or(0)));
            tokio::select! {
                _ = g.lost() => say("lost"),
                _ = tokio::time::sleep(CHILD_TTL) => {}
            }
            0
        }
        // dir name port: hold name, publishing `host` and `port` as owner
        // fields, until killed.
        "hold_fields" => {
            let l = Locker::builder()
                .directory(&args[0])
                .owner_field("host", "127.0.0.1")
                .owner_field("port", args[2].parse::<u16>().unwrap())
                .build()
                .expect("locker");
            let g = l.acquire(&args[1]).await.expect("acquire");
            say("acquired");
            tokio::select! {
                _ = g.lost() => say("lost"),
                _ = tokio::time::sleep(CHILD_TTL) => {}
            }
            0
        }
        // dir name n log: n acquisitions, logging each fencing token under
        // the lock, so the log is in acquisition order.
        "tokens" => {
            let l = locker(&args[0], 10_000, 2);
            let n: u32 = args[2].parse().unwrap();
            for _ in 0..n {
                let g = l.acquire(&args[1]).await.expect("acquire");
                let token = g.fencing_token().expect("fencing is on");
                append(&args[3], &format!("{token} {pid}"));
                drop(g);
            }
            say("done");
            0
        }
        // dir name lease_ms ms: try to take a held lock every 50 ms for
        // `ms`; says "stole" at once if it ever gets it, else "kept n".
        "try_for" => {
            let l = locker(&args[0], args[2].parse().unwrap(), 10);
            let until = Instant::now() + Duration::from_millis(args[3].parse().unwrap());
            say("trying");
            let mut tries = 0;
            while Instant::now() < until {
                if l.try_acquire(&args[1]).await.expect("try_acquire").is_some() {
                    say("stole");
                    return 1;
                }
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            say(&format!("kept {tries}"));
            0
        }
        // dir name ms: hold the lock for a while, then release it.
        "hold_for" => {
            let l = locker(&args[0], 60_000, 10);
            let g = l.acquire(&args[1]).await.expect("acquire");
            say("acquired");
            tokio::time::sleep(Duration::from_millis(args[2].parse().unwrap())).await;
            drop(g);
            say("released");
            0
        }
        // dir name lease_ms poll_ms: wait for the lock, report how long it took.
        "acquire" => {
            let l = locker(&args[0], args[2].parse().unwrap(), args[3].parse().unwrap());
            say("waiting");
            let t0 = Instant::now();
            let g = l.acquire(&args[1]).await.expect("acquire");
            say(&format!("acquired {}", t0.elapsed().as_millis()));
            drop(g);
            0
        }
        // dir name n timeout_ms: n acquisitions bounded by timeout_ms,
        // each held 2 ms; says "waits <ms...> timeouts <k>".
        "waits" => {
            let l = locker(&args[0], 10_000, 10);
            let n: u32 = args[2].parse().unwrap();
            let timeout = Duration::from_millis(args[3].parse().unwrap());
            say("waiting");
            let (mut waits, mut timeouts) = (Vec::new(), 0);
            for _ in 0..n {
                let t0 = Instant::now();
                match l.acquire_timeout(&args[1], timeout).await {
                    Ok(g) => {
                        waits.push(t0.elapsed().as_millis().to_string());
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        drop(g);
                    }
                    Err(leasehold::Error::Timeout { .. }) => timeouts += 1,
                    Err(e) => panic!("acquire: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            say(&format!("waits {} timeouts {timeouts}", waits.join(" ")));
            0
        }
        // dir name: loop `try_acquire` (which never stands in line) until
        // killed, holding the lock 2 ms whenever it gets it.
        "try_loop" => {
            let l = locker(&args[0], 10_000, 10);
            say("trying");
            loop {
                if let Some(g) = l.try_acquire(&args[1]).await.expect("try_acquire") {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    drop(g);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        // dir name: take and drop the lock in a loop until killed (a
        // holder taking it again within its turns), holding it 1 ms.
        "turns" => {
            let l = locker(&args[0], 10_000, 10);
            say("looping");
            loop {
                let g = l.acquire(&args[1]).await.expect("acquire");
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(g);
            }
        }
        // dir uid start,len...: become `uid` (if not empty) before opening
        // anything, open the lock directory read-only and hold an OFD read
        // lock on each range (len 0: to the end), each through its own
        // open file description, until killed.
        #[cfg(target_os = "linux")]
        "squat" => {
            use nix::fcntl::{FcntlArg, fcntl};
            if !args[1].is_empty() {
                let id: u32 = args[1].parse().unwrap();
                nix::unistd::setgroups(&[]).expect("setgroups");
                nix::unistd::setgid(nix::unistd::Gid::from_raw(id)).expect("setgid");
                nix::unistd::setuid(nix::unistd::Uid::from_raw(id)).expect("setuid");
            }
            let mut held = Vec::new();
            for spec in &args[2..] {
                let (start, len) = spec.split_once(',').expect("start,len");
                let fd = std::fs::File::open(&args[0]).expect("open the lock directory");
                let lock = nix::libc::flock {
                    l_type: nix::libc::F_RDLCK as i16,
                    l_whence: nix::libc::SEEK_SET as i16,
                    l_start: start.parse().unwrap(),
                    l_len: len.parse().unwrap(),
                    l_pid: 0,
                };
                fcntl(&fd, FcntlArg::F_OFD_SETLK(&lock)).expect("read lock");
                held.push(fd);
            }
            say(&format!("squatting uid {}", nix::unistd::geteuid()));
            tokio::time::sleep(CHILD_TTL).await;
            drop(held);
            0
        }
        // [dir, uid]: as `uid` (unless empty), with only the access a
        // reader of the lock directory has, grab every lock it can: the
        // directory's `flock`, every entry it can open (`flock`, and an
        // OFD read lock on every byte), and the whole byte range of the
        // directory (the waiting line), looking again for new entries
        // every 20 ms.
        #[cfg(target_os = "linux")]
        "reader" => {
            use nix::fcntl::{FcntlArg, fcntl};
            if !args[1].is_empty() {
                let id: u32 = args[1].parse().unwrap();
                nix::unistd::setgroups(&[]).expect("setgroups");
                nix::unistd::setgid(nix::unistd::Gid::from_raw(id)).expect("setgid");
                nix::unistd::setuid(nix::unistd::Uid::from_raw(id)).expect("setuid");
            }
            let every_byte = nix::libc::flock {
                l_type: nix::libc::F_RDLCK as i16,
                l_whence: nix::libc::SEEK_SET as i16,
                l_start: 0,
                l_len: 0,
                l_pid: 0,
            };
            let grab = |path: &std::path::Path| -> Option<std::fs::File> {
                let file = std::fs::File::open(path).ok()?;
                let _ = file.try_lock();
                let _ = fcntl(&file, FcntlArg::F_OFD_SETLK(&every_byte));
                Some(file)
            };
            let dir = std::path::Path::new(&args[0]);
            let mut held = vec![grab(dir).expect("the lock directory is readable")];
            let mut seen = std::collections::HashSet::new();
            say(&format!("reading as uid {}", nix::unistd::geteuid()));
            let until = std::time::Instant::now() + CHILD_TTL;
            while std::time::Instant::now() < until {
                for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    if seen.insert(entry.file_name())
                        && let Some(file) = grab(&entry.path())
                    {
                        held.push(file);
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            drop(held);
            0
        }
        other => {
            eprintln!("unknown role {other}");
            2
        }
    }
}

/// A child process of the test, killed (by pid) and reaped when dropped.
/// Its stderr is kept, and shown only if the test fails (see
/// [`stderr_tap`]).
pub struct ChildProc {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: StderrTap,
}

impl ChildProc {
    pub fn spawn(role: &str, args: &[&str]) -> Self {
        Self::spawn_with(leasehold::Strategy::ExclusiveFile, role, args)
    }

    /// A child whose lockers use `strategy`.
    pub fn spawn_with(strategy: leasehold::Strategy, role: &str, args: &[&str]) -> Self {
        Self::spawn_env(strategy, role, args, &[])
    }

    /// A child with extra environment variables.
    pub fn spawn_env(strategy: leasehold::Strategy, role: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_via(&[], strategy, role, args, env)
    }

    /// A child started through `wrapper` (for example `unshare ... --fork`),
    /// which must exec or fork the test binary and exit when it does.
    /// `pid()` is then the wrapper's.
    pub fn spawn_via(
        wrapper: &[&str],
        strategy: leasehold::Strategy,
        role: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let strategy = if strategy == leasehold::Strategy::Directory {
            "dir"
        } else {
            "file"
        };
        let mut command = reexec::child_process_via(wrapper);
        command
            .env(ROLE_ENV, role)
            .env(STRATEGY_ENV, strategy)
            .envs(env.iter().copied())
            .env(ARGS_ENV, args.join("\u{1f}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = stderr_tap::stderr_for(&mut command).spawn().expect("spawn child");
        let stderr = StderrTap::new(&mut child);
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest may have printed "test child_process_entry ... "
                // on the same line first.
                if let Some((_, msg)) = line.split_once("@@")
                    && tx.send(msg.to_owned()).is_err()
                {
                    return;
                }
            }
        });
        Self { child, lines, stderr }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next message starting with `prefix`, or a panic after `within`
    /// (or at once if the child says `failed ...`).
    pub fn expect(&self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(line) if line.starts_with("failed") => {
                    panic!("child {} failed: {line}", self.pid())
                }
                Ok(_) => continue,
                Err(_) => panic!("child {} did not say {prefix:?} within {within:?}", self.pid()),
            }
        }
    }

    #[cfg(unix)]
    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid() as i32), signal).expect("signal child");
    }

    /// The child's next message, whatever it is, or a panic after `within`.
    pub fn next_line(&self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("child {} said nothing within {within:?}", self.pid()))
    }

    /// Whether the child is stopped (state `T` in /proc).
    #[cfg(unix)]
    pub fn stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .ok()
            .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
            .unwrap_or(false)
    }

    /// Waits until the child (the `what` of the panic) is stopped; panics
    /// after `within`.
    #[cfg(unix)]
    pub fn wait_stopped(&self, what: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.stopped() {
            assert!(Instant::now() < deadline, "the {what} never stopped");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the child at once, as a crash would, without reaping it:
    /// SIGKILL by pid on Unix, `TerminateProcess` through the handle std
    /// keeps on Windows. Either way the kernel drops its liveness mark
    /// (`flock`, `LockFileEx`) with the process.
    pub fn kill(&mut self) {
        #[cfg(unix)]
        self.signal(Signal::SIGKILL);
        #[cfg(windows)]
        self.child.kill().expect("kill child");
    }

    /// Waits for the child to exit; panics after `within`.
    pub fn wait(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "child {} still running after {within:?}",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the child (by pid) if it still runs, and reaps it.
    pub fn kill_and_reap(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            #[cfg(unix)]
            let _ = kill(Pid::from_raw(self.pid() as i32), Signal::SIGKILL);
            // TerminateProcess, through the handle std keeps.
            #[cfg(windows)]
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.kill_and_reap();
        self.stderr.show_if_failing();
    }
}

/// The file in which, on Windows, leasehold keeps the waiting line of a
/// lock directory once a waiter has stood in line there, and leaves for
/// good (docs/guarantees.md, *Platforms*).
pub const LINE_FILE: &str = "leasehold..line";

/// Lists the directory's entries, sorted, for "nothing left behind"
/// checks: all but the waiting line's file.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name != LINE_FILE)
        .collect();
    names.sort();
    names
}

/// A `Locker` of `dir` with `strategy` whose lease (20 s, renewed every
/// 5 s) outlasts any test: its holders never lose a lock to time while a
/// test stops a process part way.
pub fn patient_locker(dir: &Path, strategy: leasehold::Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(Duration::from_secs(20))
        .renew_interval(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// [`entries`] of `dir` once it is empty, or as they are after `wait` if
/// it never empties: what is left once every holder is gone. A guard's
/// drop that finds the name's mutation lock taken (on Windows, where
/// waiters and markers are also polled, by a neighbour's look at the
/// marker) leaves the release to the release thread, which finishes it
/// within milliseconds; and a file removed while another handle has it
/// open goes when that handle closes. Blocks its thread.
pub fn left_after(dir: &Path, wait: Duration) -> Vec<String> {
    let until = Instant::now() + wait;
    loop {
        let left = entries(dir);
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Writes `content` as the lock record at `path` for `strategy` (a file, or
/// a directory holding `owner.json`), last modified `age` ago.
pub fn plant(strategy: leasehold::Strategy, path: &Path, content: &str, age: Duration) {
    use std::fs::{File, FileTimes};
    let mtime = std::time::SystemTime::now() - age;
    let times = FileTimes::new().set_modified(mtime).set_accessed(mtime);
    let record = if strategy == leasehold::Strategy::Directory {
        std::fs::create_dir_all(path).unwrap();
        path.join("owner.json")
    } else {
        path.to_owned()
    };
    std::fs::write(&record, content).unwrap();
    File::options()
        .write(true)
        .open(&record)
        .unwrap()
        .set_times(times)
        .unwrap();
    if record != path {
        File::open(path).unwrap().set_times(times).unwrap();
    }
}

/// An ISO-8601 timestamp as JavaScript's `toISOString()` writes it.
pub fn iso(t: std::time::SystemTime) -> String {
    let ms = t
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i128;
    let dt = time::OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000).unwrap();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        ms % 1000
    )
}

/// A pid that no process has: a child that has exited and been reaped.
pub fn dead_pid() -> u32 {
    #[cfg(unix)]
    let mut child = Command::new("true").spawn().expect("spawn true");
    #[cfg(windows)]
    let mut child = Command::new("cmd")
        .args(["/C", "exit"])
        .spawn()
        .expect("spawn cmd");
    let pid = child.id();
    child.wait().expect("reap");
    pid
}

#[cfg(unix)]
/// Field 22 of `/proc/<pid>/stat`: the start in clock ticks since boot,
/// which is the `startTime` pi-research's process-lifecycle service writes
/// and compares on Linux.
pub fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

#[cfg(unix)]
/// This process's start in ms since the epoch (boot time plus start
/// ticks), as writers that use the wall clock record it.
pub fn own_start_ms() -> u64 {
    let ticks = start_ticks(std::process::id());
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as u64;
    btime * 1000 + ticks * 1000 / hz
}

/// A layout's short name, for messages.
pub fn layout_label(strategy: leasehold::Strategy) -> &'static str {
    if strategy == leasehold::Strategy::Directory {
        "dir"
    } else {
        "file"
    }
}

/// A section of a log the children [`append`] to (`S role id ns`, then
/// `E role id ns` or `L role id ns`): role, id, start, end (`None`: still
/// open), and whether it ended lost.
#[derive(Debug, Clone)]
pub struct Sec {
    pub role: char,
    pub id: String,
    pub start: u64,
    pub end: Option<u64>,
    pub lost: bool,
}

/// The sections of the log at `log`, and the moment of its `A` line (a
/// writer asked), if it has one; a panic on a malformed line.
pub fn sections(log: &Path) -> (Vec<Sec>, Option<u64>) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut secs: Vec<Sec> = Vec::new();
    let mut asked = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let ns: u64 = f[3].parse().unwrap();
        match f[0] {
            "A" => asked = Some(ns),
            "S" => secs.push(Sec {
                role: f[1].chars().next().unwrap(),
                id: f[2].to_owned(),
                start: ns,
                end: None,
                lost: false,
            }),
            "E" | "L" => {
                let s = secs
                    .iter_mut()
                    .rev()
                    .find(|s| s.id == f[2] && s.end.is_none())
                    .unwrap_or_else(|| panic!("an end without a start: {line}"));
                s.end = Some(ns);
                s.lost = f[0] == "L";
            }
            _ => panic!("malformed log line {line:?}"),
        }
    }
    (secs, asked)
}

/// Whether Node.js is installed, which the seeds' drivers need (saying
/// so if not: the caller skips).
#[cfg(unix)]
pub fn node() -> bool {
    let ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: node is not installed, so the seeds' code cannot run here");
    }
    ok
}

/// Runs a seed's driver (`tests/fixtures/<seed>/driver.mjs`), killed by pid
/// if it outlives `within`; its output lines.
#[cfg(unix)]
pub fn seed(which: &str, dir: &Path, name: &str, mode: &[&str], within: Duration) -> Vec<String> {
    let driver = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(which)
        .join("driver.mjs");
    let mut child = Command::new("node")
        .arg(driver)
        .arg(dir)
        .arg(name)
        .args(mode)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run node");
    let deadline = Instant::now() + within;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
            panic!("{which} {mode:?} still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() || mode[0] == "try_for",
        "{which} {mode:?}: {out:?}"
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A `flock` kept on `path` (a file, made if missing, or a directory), as
/// by a process frozen while holding it.
pub fn frozen_flock(path: &Path) -> std::fs::File {
    let file = std::fs::File::options()
        .read(true)
        .write(!path.is_dir())
        .create(!path.is_dir())
        .truncate(false)
        .open(path)
        .unwrap();
    file.lock().unwrap();
    file
}

/// A name's mutation lock (`<lock>.mutex`, src/fs/mutex.rs) held by the
/// test, as by a process slow or frozen while it changes the name: taken
/// as leasehold takes it, and let go as leasehold lets it go (the file
/// removed, then unlocked, as the fields drop after `drop`).
#[derive(Debug)]
pub struct MutationLock {
    path: std::path::PathBuf,
    file: std::fs::File,
}

impl MutationLock {
    /// Waits for the lock at `path` (the mutation-lock file); `None` when
    /// the file cannot be opened (the test's directory gone: its test is
    /// over). The flock, then a look that the path still names the file
    /// locked, else again: its last holder may have removed it (and the
    /// next made a new one) while we waited, and letting go of a removed
    /// file we locked would remove the next holder's, so that two
    /// processes held the name's mutation lock. Without the look, a CI
    /// run saw a reader and a writer hold at once (2026-12-06).
    pub fn take(path: &Path) -> Option<MutationLock> {
        loop {
            let file = std::fs::File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .ok()?;
            file.lock().unwrap();
            if names(path, &file) {
                return Some(MutationLock {
                    path: path.to_owned(),
                    file,
                });
            }
        }
    }
}

impl Drop for MutationLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `path` names the file open as `file`.
#[cfg(unix)]
fn names(path: &Path, file: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let open = file.metadata().unwrap();
    std::fs::symlink_metadata(path).is_ok_and(|named| (named.dev(), named.ino()) == (open.dev(), open.ino()))
}

/// Taken to be so: std has no stable name of a file's identity on Windows
/// (src/sys/windows reads the file index through the Win32 API).
#[cfg(windows)]
fn names(_path: &Path, _file: &std::fs::File) -> bool {
    true
}

/// Takes the mutation lock at `path` ([`MutationLock`]), holds it `hold`
/// and lets it go: a slow process changing the name.
pub fn hold_mutation_lock(path: &Path, hold: Duration) {
    if let Some(held) = MutationLock::take(path) {
        std::thread::sleep(hold);
        drop(held);
    }
}

/// The mutation-lock file of the lock at `lock_path` (docs/format.md,
/// *The mutation lock of a name*).
pub fn mutex_of(lock_path: &Path) -> std::path::PathBuf {
    let mut name = lock_path.file_name().unwrap().to_owned();
    name.push(".mutex");
    lock_path.with_file_name(name)
}

/// `<lock path>.members`: a shared lock's or semaphore's members
/// directory (docs/format.md).
pub fn members_of(lock_path: &Path) -> std::path::PathBuf {
    let mut name = lock_path.file_name().unwrap().to_owned();
    name.push(".members");
    lock_path.with_file_name(name)
}

/// A step one thread reaches and another waits for, with a bound: for
/// failpoint callbacks that stop one thread until the test lets it on.
#[derive(Default)]
pub struct Step {
    reached: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Step {
    pub fn reach(&self) {
        *self.reached.lock().unwrap() = true;
        self.cv.notify_all();
    }

    /// Whether it was reached within 20 s.
    pub fn wait(&self) -> bool {
        let reached = self.reached.lock().unwrap();
        let (reached, _) = self
            .cv
            .wait_timeout_while(reached, Duration::from_secs(20), |r| !*r)
            .unwrap();
        *reached
    }
}

/// Parses a child's "waits <ms...> timeouts <k>" line: (mean wait in ms,
/// timeouts).
pub fn parse_waits(line: &str) -> (f64, usize) {
    let (waits, timeouts) = line
        .strip_prefix("waits ")
        .and_then(|rest| rest.split_once("timeouts "))
        .expect("a waits line");
    let waits: Vec<f64> = waits.split_whitespace().map(|w| w.parse().unwrap()).collect();
    let mean = waits.iter().sum::<f64>() / waits.len().max(1) as f64;
    (mean, timeouts.trim().parse().unwrap())
}

/// Whether any process holds an OFD lock on a byte of the directory `dir`:
/// the waiting line's tickets (a holder that is not in the middle of a
/// turn holds none), for tests that wait until a waiter stands in line.
#[cfg(target_os = "linux")]
pub fn anyone_in_line(dir: &Path) -> bool {
    use nix::fcntl::{FcntlArg, fcntl};
    let file = std::fs::File::open(dir).unwrap();
    // The whole range, as a writer would take it: any byte held conflicts.
    let mut lock = nix::libc::flock {
        l_type: nix::libc::F_WRLCK as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    fcntl(&file, FcntlArg::F_OFD_GETLK(&mut lock)).unwrap();
    i32::from(lock.l_type) != nix::libc::F_UNLCK
}

/// With the environment variable `var` set to `point@n`, stops this
/// process (`SIGSTOP`) at the `n`th pass of the failpoint `point`, first
/// saying "freezing at <point> <ms since the epoch>". Unset, nothing.
#[cfg(all(unix, feature = "failpoints"))]
pub fn arm_freeze(var: &str) {
    let Ok(spec) = std::env::var(var) else {
        return;
    };
    let (point, nth) = spec.split_once('@').expect("point@n");
    let nth: u32 = nth.parse().expect("point@n");
    let seen = std::sync::atomic::AtomicU32::new(0);
    let at = point.to_owned();
    fail::cfg_callback(point, move || {
        if seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == nth {
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis();
            say(&format!("freezing at {at} {ms}"));
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
        }
    })
    .unwrap();
}

/// Without failpoints there is nothing to freeze at: `var` must be unset.
#[cfg(not(all(unix, feature = "failpoints")))]
pub fn arm_freeze(var: &str) {
    assert!(std::env::var_os(var).is_none(), "failpoints feature needed");
}
