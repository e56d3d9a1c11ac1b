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
    let binary = examples_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
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
    let mut tries = 0;
    let mut child = loop {
        let out = std::fs::File::create(&out_path).expect("stdout file");
        let err = std::fs::File::create(&err_path).expect("stderr file");
        let spawned = Command::new(&binary)
            .current_dir(scratch.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn();
        match spawned {
            Ok(child) => break child,
            // Wine's CreateProcess now and then answers ERROR_INTERNAL_ERROR
            // (1359) while several processes start at once: start again.
            Err(e) if e.raw_os_error() == Some(1359) && tries < 5 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("cannot start {}: {e}", binary.display()),
        }
    };
    let pid = child.id();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the example") {
            break status;
        }
        if started.elapsed() > BOUND {
            // End it (SIGKILL; TerminateProcess on Windows), and whatever
            // it started in its process group is its own.
            let _ = child.kill();
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

/// The pid in a line's `(pid N)` or `pid N`.
fn pid_in(line: &str) -> Option<u32> {
    let rest = &line[line.find("pid ")? + 4..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The fencing token in a line's `[token N]`.
fn token_in(line: &str) -> Option<u64> {
    let rest = &line[line.find("[token ")? + 7..];
    rest[..rest.find(']')?].parse().ok()
}

/// Checks a transcript of the demo: a worker says it holds the lock only
/// when the previous holder has said it is releasing it, or has been named
/// and killed; each holder shows a fencing token larger than the last; and
/// the story (turns, a kill, a takeover, a clean end) is all there.
fn check_demo(transcript: &str) -> Result<(), String> {
    let (mut holder, mut last_token) = (None::<u32>, 0);
    let (mut turns, mut kills, mut takeovers) = (0, 0, 0);
    for (n, line) in transcript.lines().enumerate() {
        let at = || format!("line {}: {line:?}", n + 1);
        if line.starts_with("worker ") && line.contains(" holds ") {
            let pid = pid_in(line).ok_or_else(|| format!("no pid at {}", at()))?;
            if let Some(previous) = holder {
                return Err(format!(
                    "pid {pid} holds while pid {previous} has not let go, at {}",
                    at()
                ));
            }
            let token = token_in(line).ok_or_else(|| format!("no fencing token at {}", at()))?;
            if token <= last_token {
                return Err(format!("token {token} after {last_token}, at {}", at()));
            }
            (holder, last_token, turns) = (Some(pid), token, turns + 1);
        } else if line.starts_with("worker ") && line.contains(" releas") {
            let pid = pid_in(line);
            if holder != pid {
                return Err(format!(
                    "pid {pid:?} lets go of a lock pid {holder:?} holds, at {}",
                    at()
                ));
            }
            holder = None;
        } else if line.starts_with(">>>") && line.contains("killing it") {
            let pid = pid_in(line);
            // Its own line may not have been printed before it was frozen.
            if holder.is_some() && holder != pid {
                return Err(format!(
                    "pid {pid:?} killed while pid {holder:?} holds, at {}",
                    at()
                ));
            }
            (holder, kills) = (None, kills + 1);
        } else if line.starts_with(">>>") && line.contains(" took ") && line.contains("after the kill") {
            takeovers += 1;
        }
    }
    let ends = transcript.contains("all workers done; lock left on disk: false");
    if turns < 4 || kills != 1 || takeovers != 1 || !ends {
        return Err(format!(
            "{turns} turns, {kills} kills, {takeovers} takeovers, clean end: {ends}"
        ));
    }
    Ok(())
}

#[test]
fn the_demo_checker_catches_an_overlap() {
    let good = "worker 1 (pid 10) holds \"x\" [token 1] after waiting 1ms\n\
                worker 1 (pid 10) releasing it\n\
                worker 2 (pid 11) holds \"x\" [token 5] after waiting 1ms\n\
                >>> worker 2 (pid 11) holds \"x\" [token 5]; frozen with SIGSTOP now, killing it with SIGKILL\n\
                worker 3 (pid 12) holds \"x\" [token 9] after waiting 1ms\n\
                >>> worker 3 (pid 12) took \"x\" 1ms after the kill\n\
                worker 3 (pid 12) releasing it\n\
                worker 1 (pid 10) holds \"x\" [token 10] after waiting 1ms\n\
                worker 1 (pid 10) releasing it\n\
                all workers done; lock left on disk: false\n";
    check_demo(good).unwrap();
    // The next holder's line before the last one's.
    let overlap = good.replacen(
        "worker 1 (pid 10) releasing it\nworker 2 (pid 11) holds \"x\" [token 5] after waiting 1ms\n",
        "worker 2 (pid 11) holds \"x\" [token 5] after waiting 1ms\nworker 1 (pid 10) releasing it\n",
        1,
    );
    assert!(check_demo(&overlap).unwrap_err().contains("has not let go"));
    let backwards = good.replacen("[token 10]", "[token 3]", 1);
    assert!(check_demo(&backwards).unwrap_err().contains("token 3 after 9"));
    let other_killed = good.replacen("worker 1 (pid 10) releasing it\n", "", 1);
    assert!(check_demo(&other_killed).is_err());
}

/// The demo is the first program a newcomer runs: its output must never
/// read as two holders at once, on any run. Several runs at once, as a
/// loaded machine would interleave them.
#[test]
fn the_demo_never_shows_two_holders_at_once() {
    let runs: usize = std::env::var("LEASEHOLD_DEMO_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(8);
    let transcripts: Vec<String> = std::thread::scope(|s| {
        let batches: Vec<_> = (0..4)
            .map(|batch| s.spawn(move || (batch..runs).step_by(4).map(|_| run("demo")).collect::<Vec<_>>()))
            .collect();
        batches.into_iter().flat_map(|b| b.join().unwrap()).collect()
    });
    assert_eq!(transcripts.len(), runs);
    for transcript in &transcripts {
        if let Err(e) = check_demo(transcript) {
            panic!("{e}\n--- the demo printed:\n{transcript}");
        }
    }

    // The README's copy of the output is in step with the demo: each of
    // its lines has the shape of a line the demo printed, and it reads
    // as a transcript should.
    // (The README shows a Unix run: Windows freezes the holder by other
    // means.)
    let printed: std::collections::HashSet<String> = transcripts
        .iter()
        .flat_map(|t| t.lines())
        .map(|line| shape(&line.replace("frozen by a debugger now", "frozen with SIGSTOP now")))
        .collect();
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let copy = readme
        .split_once("The demo prints this")
        .and_then(|(_, rest)| rest.split_once("```text\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(copy, _)| copy)
        .expect("the README shows the demo's output in a ```text block after \"The demo prints this\"");
    for line in copy.lines().filter(|l| !l.is_empty()) {
        assert!(
            printed.contains(&shape(line)),
            "the README shows a line the demo does not print: {line:?}"
        );
    }
    check_demo(copy).unwrap_or_else(|e| panic!("the README's demo output: {e}"));
}

/// A line with its numbers (and their units: `2.3ms`, `60s`) made `#`.
fn shape(line: &str) -> String {
    let mut shaped = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if !c.is_ascii_digit() {
            shaped.push(c);
            continue;
        }
        while chars.next_if(|c| c.is_ascii_digit() || *c == '.').is_some() {}
        while chars.next_if(|c| matches!(c, 'n' | 'µ' | 'm' | 's')).is_some() {}
        shaped.push('#');
    }
    shaped
}
