//! Every program in `examples/` runs to completion and exits 0: the
//! examples are documentation, and documentation that does not run is
//! wrong. `cargo test` builds the examples before it runs this test; each
//! runs with a time bound and is killed by pid if it overruns.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: the slowest example takes a few seconds on an idle machine.
const BOUND: Duration = Duration::from_secs(90);

/// `target/<profile>/examples`, next to this test's `deps/` directory.
fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    deps.parent().expect("profile directory").join("examples")
}

fn example_names() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("examples/ is readable")
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            (path.extension()? == "rs").then(|| path.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    names.sort();
    names
}

/// Runs one example; returns its stdout, or panics with what went wrong.
fn run(name: &str) -> String {
    let binary = examples_dir().join(name);
    assert!(
        binary.exists(),
        "{} is not built: run `cargo test` without a target filter (it builds the examples) \
         or `cargo build --examples` first",
        binary.display()
    );
    let scratch = tempfile::tempdir().expect("scratch directory");
    // Files, not pipes: a full pipe would stall the example, and a process
    // it started that outlives it would keep a pipe open.
    let (out_path, err_path) = (scratch.path().join("stdout"), scratch.path().join("stderr"));
    let out = std::fs::File::create(&out_path).expect("stdout file");
    let err = std::fs::File::create(&err_path).expect("stderr file");
    let mut child = Command::new(&binary)
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    let pid = child.id();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the example") {
            break status;
        }
        if started.elapsed() > BOUND {
            // End it, and whatever it started in its process group is its own.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            panic!("example {name} (pid {pid}) ran over {BOUND:?} and was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        status.success(),
        "example {name} failed ({status}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    stdout
}

#[test]
fn every_example_runs_and_exits_zero() {
    let names = example_names();
    assert!(names.contains(&"demo".to_owned()), "examples found: {names:?}");
    for name in &names {
        let started = Instant::now();
        let stdout = run(name);
        assert!(!stdout.trim().is_empty(), "example {name} printed nothing");
        eprintln!("example {name}: ok in {:?}", started.elapsed());
    }
}
