//! Child processes that are this very test binary, running only its
//! `child_process_entry` test, which picks a role from the environment.

use std::process::Command;

/// This test binary, set up to run `child_process_entry` alone; the caller
/// adds the role's environment and stdio.
pub fn child_process() -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary's path"));
    command.args([
        "--exact",
        "child_process_entry",
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    command
}
