//! How a test suite uses `leasehold::testing`: these tests share one
//! resource (here a file standing for a database) and must not overlap,
//! whether `cargo test` runs them on parallel threads or `cargo nextest`
//! runs each in its own process.

use std::io::Write;
use std::time::Duration;

/// The shared resource: every test writes "begin", works, writes "end".
/// One per user: `/tmp` is everyone's on Unix; Windows' temporary
/// directory is the user's own.
fn shared_log() -> std::path::PathBuf {
    #[cfg(unix)]
    let name = format!("leasehold-testing-example-{}.log", nix::unistd::geteuid());
    #[cfg(windows)]
    let name = "leasehold-testing-example.log".to_owned();
    std::env::temp_dir().join(name)
}

fn use_the_resource(test: &str) {
    let log = shared_log();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&log)
        .unwrap();
    writeln!(f, "begin {test}").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    writeln!(f, "end {test}").unwrap();
    // Nobody else got in between our begin and end.
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let begin = lines.iter().rposition(|l| *l == format!("begin {test}")).unwrap();
    assert_eq!(
        lines[begin + 1],
        format!("end {test}"),
        "another test used the resource meanwhile"
    );
}

#[tokio::test]
async fn first_test_using_the_database() {
    let _serial = leasehold::testing::serial("example-database").await;
    use_the_resource("first");
}

#[tokio::test]
async fn second_test_using_the_database() {
    let _serial = leasehold::testing::serial("example-database").await;
    use_the_resource("second");
}

#[test]
fn a_synchronous_test_using_the_database() {
    let _serial = leasehold::testing::blocking_serial("example-database");
    use_the_resource("third");
}
