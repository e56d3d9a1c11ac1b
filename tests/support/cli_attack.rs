//! What the attacks on `leasehold run` share (tests/attack_cold_cli.rs,
//! tests/attack_two_cli.rs, tests/attack_three_cli.rs): the tool as a
//! command, a started process bounded by [`BOUND`] and killed by pid when
//! dropped, CMD's process groups killed when dropped, and looks at /proc
//! and at files. Linux only.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long any process started by these tests may run.
pub const BOUND: Duration = Duration::from_secs(40);

pub fn leasehold(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    cmd.args(args)
        .env_remove("LEASEHOLD_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// A started process, SIGCONTed, SIGKILLed and reaped when dropped.
pub struct Proc(pub Child);

impl Proc {
    pub fn spawn(mut cmd: Command) -> Self {
        Self(cmd.spawn().expect("spawn"))
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.0.id()).expect("pid"))
    }

    pub fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + BOUND;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "process {} still running", self.0.id());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn stderr(&mut self) -> String {
        use std::io::Read;
        let mut text = String::new();
        if let Some(mut err) = self.0.stderr.take() {
            let _ = err.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = kill(self.pid(), Signal::SIGCONT);
            let _ = kill(self.pid(), Signal::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

/// Kills the process groups (CMDs') when dropped.
pub struct GroupKill(pub Vec<Pid>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        for group in &self.0 {
            let _ = nix::sys::signal::killpg(*group, Signal::SIGKILL);
        }
    }
}

/// The children of `parent` whose `comm` is `name`.
pub fn children_named(parent: Pid, name: &str) -> Vec<Pid> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((comm_part, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let comm = comm_part.split_once(" (").map_or("", |(_, c)| c);
        let ppid: i32 = rest.split(' ').nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == parent.as_raw() && comm == name {
            found.push(Pid::from_raw(pid));
        }
    }
    found
}

pub fn await_file(path: &Path) {
    let deadline = Instant::now() + BOUND;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}
