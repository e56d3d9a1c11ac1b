//! A child process's stderr, kept rather than passed to the test run's.
//!
//! Tests stop their children on purpose: a lost lock makes the tool warn
//! and send SIGTERM to its command (whose shell then says `Terminated`),
//! `unshare` warns about its signal mask, a killed child's wrapper
//! complains. Passed through, those lines read like failures in a run that
//! passed. Kept, they are shown when the test fails (the tap is dropped
//! while the test panics), and always with `LEASEHOLD_TEST_VERBOSE=1`,
//! which passes every child's stderr through as it comes.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// Set (to anything but `0`) to see children's stderr as it comes.
pub const VERBOSE_ENV: &str = "LEASEHOLD_TEST_VERBOSE";

/// How long a failing test waits for the rest of a child's stderr: a
/// grandchild may hold the pipe open long after the child is gone.
const DRAIN: Duration = Duration::from_millis(500);

fn verbose() -> bool {
    std::env::var_os(VERBOSE_ENV).is_some_and(|v| v != "0")
}

/// Sets `command`'s stderr: a pipe for a [`StderrTap`] to read, or the
/// test's own with [`VERBOSE_ENV`] set.
pub fn stderr_for(command: &mut Command) -> &mut Command {
    if verbose() {
        command.stderr(Stdio::inherit())
    } else {
        command.stderr(Stdio::piped())
    }
}

/// What a child wrote to stderr, read as it comes (so the child never
/// blocks on a full pipe) and printed if the test fails.
pub struct StderrTap {
    pid: u32,
    text: Arc<Mutex<String>>,
    ended: mpsc::Receiver<()>,
}

impl StderrTap {
    /// Starts reading `child`'s stderr, if [`stderr_for`] made it a pipe.
    pub fn new(child: &mut Child) -> Self {
        let text = Arc::new(Mutex::new(String::new()));
        let (tx, ended) = mpsc::channel();
        if let Some(stderr) = child.stderr.take() {
            let kept = Arc::clone(&text);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut text = kept.lock().unwrap_or_else(|e| e.into_inner());
                    text.push_str(&line);
                    text.push('\n');
                }
                let _ = tx.send(());
            });
        }
        Self {
            pid: child.id(),
            text,
            ended,
        }
    }

    /// What the child wrote so far.
    pub fn text(&self) -> String {
        self.text.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Prints what the child wrote, if the test is failing: call it once
    /// the child has ended, from the owner's `Drop`.
    pub fn show_if_failing(&self) {
        if !std::thread::panicking() {
            return;
        }
        let _ = self.ended.recv_timeout(DRAIN);
        let text = self.text();
        if !text.is_empty() {
            eprintln!(
                "--- stderr of child {} ---\n{text}--- end of its stderr ---",
                self.pid
            );
        }
    }
}
