//! Child processes that are this very test binary, running only its
//! `child_process_entry` test, which picks a role from the environment.

use std::process::Command;

/// This test binary, set up to run `child_process_entry` alone; the caller
/// adds the role's environment and stdio.
pub fn child_process() -> Command {
    child_process_via(&[])
}

/// Like [`child_process`], run through a wrapper command such as
/// `unshare --time --fork`, which then execs the test binary.
pub fn child_process_via(wrapper: &[&str]) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    child_process_of(&exe, wrapper)
}

/// Like [`child_process_via`], for a copy of this test binary at `exe`
/// (one another user may run, say).
#[allow(dead_code)]
pub fn child_process_of(exe: &std::path::Path, wrapper: &[&str]) -> Command {
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(exe);
            command
        }
        None => Command::new(exe),
    };
    command.args([
        "--exact",
        "child_process_entry",
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    command
}
