//! `leasehold::testing::parallel` beside `serial`, and `is_held`, across
//! threads and processes.
//!
//! The children are this test binary (tests/support/reexec.rs); they find
//! the lock directory as every test does, from the executable's place (or
//! `LEASEHOLD_SERIAL_DIR`, which they inherit), so they meet this process
//! there. Each test uses names of its own, with this process's pid in
//! them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use leasehold::testing::{blocking_is_held, blocking_parallel, blocking_serial, is_held, parallel, serial};

#[path = "support/reexec.rs"]
mod reexec;

const ROLE: &str = "LEASEHOLD_TESTING_PARALLEL_ROLE";

/// How long any child may take; they are killed past it.
const BOUND: Duration = Duration::from_secs(60);

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is not set"))
}

/// Waits until `path` exists, or gives up (in a child: the exit code says
/// so, and the parent fails).
fn await_file(path: &Path, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while !path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

fn append(log: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .unwrap();
    // Writers take turns, on a file beside the log (Windows locks are
    // mandatory: the log's own would refuse the write): parallel holders
    // append at the same time by design, and under Wine two appends at
    // once can land on the same offset (a CI run lost one line of two
    // threads of one child).
    let turn = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(log.with_extension("turn"))
        .unwrap();
    turn.lock().unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
    // Closing lets the turn go (Wine refuses `unlock` of a whole-file
    // lock).
    drop(turn);
}

/// Rounds of `kind` ("serial" or "parallel") on `name`, logged as
/// "S kind who" and "E kind who" around a short stay.
fn rounds(kind: &str, name: &str, log: &Path, who: &str, count: usize) {
    for _ in 0..count {
        let guard = match kind {
            "serial" => Box::new(blocking_serial(name)) as Box<dyn std::fmt::Debug>,
            _ => Box::new(blocking_parallel(name)),
        };
        append(log, &format!("S {kind} {who}"));
        std::thread::sleep(Duration::from_millis(3));
        append(log, &format!("E {kind} {who}"));
        drop(guard);
    }
}

/// In a child: the role named in the environment.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let name = env("NAME");
    let dir = PathBuf::from(env("DIR"));
    let pid = std::process::id();
    let code = match role.as_str() {
        // Hold `name` shared, say so, and stay until every overlapping
        // child has said so too.
        "overlap" => {
            let _parallel = blocking_parallel(&name);
            std::fs::write(dir.join(format!("in-{pid}")), "").unwrap();
            let want: usize = env("COUNT").parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let inside = std::fs::read_dir(&dir)
                    .unwrap()
                    .filter(|e| {
                        e.as_ref()
                            .unwrap()
                            .file_name()
                            .to_string_lossy()
                            .starts_with("in-")
                    })
                    .count();
                if inside == want {
                    break 0;
                }
                if Instant::now() > deadline {
                    break 3;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // Two threads, each doing rounds of its kind ("serial,parallel",
        // say), so that exclusion is shown between threads of one process
        // as well as between processes.
        "rounds" => {
            let log = dir.join("log");
            let kinds = env("KINDS");
            std::thread::scope(|s| {
                for (i, kind) in kinds.split(',').enumerate() {
                    let (name, log) = (&name, &log);
                    s.spawn(move || rounds(kind, name, log, &format!("{pid}.{i}"), 15));
                }
            });
            0
        }
        // Hold `name` as KIND, say so, and stay until told to go.
        "hold" => {
            let guard = match env("KIND").as_str() {
                "serial" => Box::new(blocking_serial(&name)) as Box<dyn std::fmt::Debug>,
                _ => Box::new(blocking_parallel(&name)),
            };
            std::fs::write(dir.join("held"), "").unwrap();
            let told = await_file(&dir.join("go"), Duration::from_secs(30));
            drop(guard);
            if told { 0 } else { 3 }
        }
        // Take `name` as KIND once, with the timeout the parent set.
        "take" => {
            match env("KIND").as_str() {
                "serial" => drop(blocking_serial(&name)),
                _ => drop(blocking_parallel(&name)),
            }
            0
        }
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}

/// A child process, killed by its pid if it is still running when dropped
/// (a failed assertion, say).
struct Kid(Child);

impl Kid {
    fn spawn(role: &str, name: &str, dir: &Path, envs: &[(&str, &str)]) -> Kid {
        let child = reexec::child_process()
            .env(ROLE, role)
            .env("NAME", name)
            .env("DIR", dir)
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Kid(child)
    }

    /// Its exit status and what it wrote to stderr, within [`BOUND`].
    fn finish(&mut self) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + BOUND;
        let status = loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "child {} did not finish within {BOUND:?}",
                self.0.id()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut stderr = String::new();
        self.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        (status, stderr)
    }

    fn succeeds(&mut self) {
        let (status, stderr) = self.finish();
        assert!(
            status.success(),
            "child {} failed: {status}\n{stderr}",
            self.0.id()
        );
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A lock name of this test, in this run.
fn name(test: &str) -> String {
    format!("testing-parallel-{test}-{}", std::process::id())
}

#[test]
fn parallel_holders_in_several_processes_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let name = name("overlap");
    // This process holds it shared too, all along: they all overlap it.
    let here = blocking_parallel(&name);
    let mut kids: Vec<Kid> = (0..3)
        .map(|_| Kid::spawn("overlap", &name, dir.path(), &[("COUNT", "3")]))
        .collect();
    for kid in &mut kids {
        kid.succeeds();
    }
    drop(here);
    assert!(!blocking_is_held(&name));
}

#[test]
fn serial_and_parallel_exclude_each_other_across_threads_and_processes() {
    let dir = tempfile::tempdir().unwrap();
    let name = name("rounds");
    let mut kids: Vec<Kid> = ["serial,parallel", "parallel,parallel", "serial,parallel"]
        .iter()
        .map(|kinds| Kid::spawn("rounds", &name, dir.path(), &[("KINDS", kinds)]))
        .collect();
    for kid in &mut kids {
        kid.succeeds();
    }
    let text = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6 * 15 * 2, "{text}");
    // Replay the log: a serial holder starts only when nobody is inside,
    // and nobody starts while it is.
    let mut inside: Vec<(&str, &str)> = Vec::new();
    let mut most_parallel = 0;
    for (at, line) in lines.iter().enumerate() {
        let mut words = line.split(' ');
        let (edge, kind, who) = (
            words.next().unwrap(),
            words.next().unwrap(),
            words.next().unwrap(),
        );
        if edge == "S" {
            assert!(
                inside.iter().all(|(k, _)| *k == "parallel") && (kind == "parallel" || inside.is_empty()),
                "line {at}: {line} while {inside:?} inside\n{text}"
            );
            inside.push((kind, who));
            most_parallel = most_parallel.max(inside.len());
        } else {
            let i = inside.iter().position(|&(k, w)| (k, w) == (kind, who)).unwrap();
            inside.remove(i);
        }
    }
    assert!(inside.is_empty());
    println!("at most {most_parallel} parallel holders at once");
    assert!(!blocking_is_held(&name));
}

/// A child taking `name` as `kind` with a 1 s timeout: whether it could.
fn child_takes(kind: &str, name: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut kid = Kid::spawn(
        "take",
        name,
        dir.path(),
        &[("KIND", kind), ("LEASEHOLD_SERIAL_TIMEOUT", "1")],
    );
    let (status, stderr) = kid.finish();
    if status.success() { Ok(()) } else { Err(stderr) }
}

#[tokio::test]
async fn a_serial_test_elsewhere_waits_for_parallel_ones_and_says_who_holds() {
    let name = name("serial-waits");
    let here = parallel(&name).await;
    let name2 = name.clone();
    let (serial_refused, parallel_taken) =
        tokio::task::spawn_blocking(move || (child_takes("serial", &name2), child_takes("parallel", &name2)))
            .await
            .unwrap();
    let stderr = serial_refused.expect_err("a serial child got in beside a parallel holder");
    assert!(
        stderr.contains(&format!("serial({name:?})"))
            && stderr.contains(&format!("held by pid {}", std::process::id())),
        "{stderr}"
    );
    parallel_taken.expect("a parallel child could not join a parallel holder");
    drop(here);
    tokio::task::spawn_blocking(move || child_takes("serial", &name))
        .await
        .unwrap()
        .expect("a serial child could not take a name nobody holds");
}

#[tokio::test]
async fn a_parallel_test_elsewhere_waits_for_a_serial_one() {
    let name = name("parallel-waits");
    let here = serial(&name).await;
    let name2 = name.clone();
    let refused = tokio::task::spawn_blocking(move || child_takes("parallel", &name2))
        .await
        .unwrap();
    let stderr = refused.expect_err("a parallel child got in beside a serial holder");
    assert!(
        stderr.contains(&format!("parallel({name:?})"))
            && stderr.contains(&format!("held by pid {}", std::process::id())),
        "{stderr}"
    );
    drop(here);
    tokio::task::spawn_blocking(move || child_takes("parallel", &name))
        .await
        .unwrap()
        .expect("a parallel child could not take a name nobody holds");
}

#[test]
fn serial_and_parallel_exclude_each_other_between_threads() {
    let name = name("threads");
    let reader = blocking_parallel(&name);
    let (tx, rx) = std::sync::mpsc::channel();
    // Set just before the serial holder lets go: a parallel holder that
    // gets in while it is clear got in beside it.
    let letting_go = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (name, letting_go) = (name.clone(), std::sync::Arc::clone(&letting_go));
        std::thread::spawn(move || {
            let guard = blocking_serial(&name);
            tx.send(()).unwrap();
            // Parallel holders wait for this one in turn.
            std::thread::sleep(Duration::from_millis(200));
            letting_go.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(guard);
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "serial got in beside parallel"
    );
    drop(reader);
    rx.recv_timeout(BOUND)
        .expect("serial did not get in once parallel left");
    let again = blocking_parallel(&name);
    assert!(
        letting_go.load(std::sync::atomic::Ordering::SeqCst),
        "parallel got in beside serial"
    );
    drop(again);
    writer.join().unwrap();
}

#[tokio::test]
async fn is_held_sees_holders_of_either_kind_in_this_process_and_others() {
    for kind in ["serial", "parallel"] {
        let name = name(&format!("is-held-{kind}"));
        assert!(!is_held(&name).await);
        let dir = tempfile::tempdir().unwrap();
        let mut kid = Kid::spawn("hold", &name, dir.path(), &[("KIND", kind)]);
        let held = dir.path().join("held");
        let arrived = tokio::task::spawn_blocking(move || await_file(&held, BOUND))
            .await
            .unwrap();
        assert!(arrived, "the child did not take {name}");
        assert!(is_held(&name).await, "{kind} in another process");
        std::fs::write(dir.path().join("go"), "").unwrap();
        tokio::task::spawn_blocking(move || kid.succeeds()).await.unwrap();
        assert!(!is_held(&name).await, "{kind} let go in another process");

        let here = match kind {
            "serial" => Box::new(serial(&name).await) as Box<dyn std::fmt::Debug + Send>,
            _ => Box::new(parallel(&name).await),
        };
        assert!(is_held(&name).await, "{kind} in this process");
        drop(here);
        assert!(!is_held(&name).await, "{kind} let go in this process");
    }
}

#[tokio::test]
async fn the_blocking_forms_work_in_async_code_too() {
    let name = name("blocking-in-async");
    let a = blocking_parallel(&name);
    let b = parallel(&name).await;
    assert!(blocking_is_held(&name));
    drop((a, b));
    assert!(!blocking_is_held(&name));
}
