//! `leasehold::testing`: tests in separate processes take turns.

use std::io::Write;
use std::process::Stdio;

#[path = "support/reexec.rs"]
mod reexec;
use std::time::{Duration, Instant};

const ROLE: &str = "LEASEHOLD_SERIAL_TEST_ROLE";

/// In a child: hold "database" through `blocking_serial`, logging entry and
/// exit; or, as "late", wait for a lock the parent holds.
#[test]
fn child_process_entry() {
    match std::env::var(ROLE).as_deref() {
        Ok("turns") => {
            let log = std::env::var("LOG").unwrap();
            for _ in 0..20 {
                let _serial = leasehold::testing::blocking_serial("database");
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&log)
                    .unwrap();
                f.write_all(format!("S {}\n", std::process::id()).as_bytes())
                    .unwrap();
                std::thread::sleep(Duration::from_millis(5));
                f.write_all(format!("E {}\n", std::process::id()).as_bytes())
                    .unwrap();
            }
            std::process::exit(0);
        }
        Ok("late") => {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async { drop(leasehold::testing::serial("database").await) });
            std::process::exit(0);
        }
        _ => {}
    }
}

fn child(role: &str, dir: &std::path::Path, envs: &[(&str, &str)]) -> std::process::Child {
    reexec::child_process()
        .env(ROLE, role)
        .env("LEASEHOLD_SERIAL_DIR", dir)
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {} did not finish within {within:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn tests_in_three_processes_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let log = log.to_str().unwrap();
    let mut kids: Vec<_> = (0..3)
        .map(|_| child("turns", dir.path(), &[("LOG", log)]))
        .collect();
    for kid in &mut kids {
        assert!(wait(kid, Duration::from_secs(60)).success());
    }
    let text = std::fs::read_to_string(log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 120);
    for pair in lines.chunks(2) {
        assert!(pair[0].starts_with('S') && pair[1].starts_with('E'), "{pair:?}");
        assert_eq!(pair[0][2..], pair[1][2..], "interleaved: {pair:?}");
    }
}

#[test]
fn a_test_that_waits_too_long_panics_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let locker = leasehold::Locker::new(dir.path()).unwrap();
    let held = rt.block_on(locker.acquire("database")).unwrap();
    let mut late = child("late", dir.path(), &[("LEASEHOLD_SERIAL_TIMEOUT", "1")]);
    let status = wait(&mut late, Duration::from_secs(30));
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(late.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let expected = format!("held by pid {}", std::process::id());
    assert!(
        stderr.contains("serial(\"database\")") && stderr.contains(&expected),
        "{stderr}"
    );
    drop(held);
}
