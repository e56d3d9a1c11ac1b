//! One development server per machine, as velocious's HTTP server lock
//! does it: the instance that holds the `dev-server` lock serves, and
//! publishes its address in the lock's record (owner fields `host` and
//! `port`); a second instance finds the lock held, reads the address from
//! the holder's record, and talks to the running server instead of
//! starting one of its own.
//!
//! ```text
//! cargo run --example server_lock
//! ```
//!
//! The example plays both parts: it starts a server, then runs itself
//! again as the second instance, in a separate process.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold::{FieldValue, Locker, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOCK: &str = "dev-server";

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("second") => second_instance(Path::new(&args[2])).await,
        _ => first_instance().await,
    }
}

/// Serves on a free port while holding the lock, and starts the second
/// instance.
async fn first_instance() -> Result<()> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
    let port = listener.local_addr().expect("address").port();
    let locker = Locker::builder()
        .directory(dir.path())
        .owner_field("host", "127.0.0.1")
        .owner_field("port", port)
        .build()?;
    let Some(guard) = locker.try_acquire(LOCK).await? else {
        println!("another server is already running");
        return Ok(());
    };
    println!(
        "first instance (pid {}): serving on 127.0.0.1:{port}",
        std::process::id()
    );
    let server = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let reply = format!("hello from the server in pid {}\n", std::process::id());
            let _ = socket.write_all(reply.as_bytes()).await;
        }
    });

    // The second instance, a process of its own; ended by pid if it hangs.
    let mut child = Command::new(std::env::current_exe().expect("this program"))
        .arg("second")
        .arg(dir.path())
        .spawn()
        .expect("start the second instance");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the second instance (pid {}) did not finish in 30 s", child.id());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "the second instance failed: {status}");

    server.abort();
    guard.release().await?;
    println!("first instance: stopped serving, lock released");
    Ok(())
}

/// Finds the lock held and connects to the server its holder published.
async fn second_instance(dir: &Path) -> Result<()> {
    let locker = Locker::new(dir)?;
    if let Some(_guard) = locker.try_acquire(LOCK).await? {
        println!("second instance: no server is running; this one would start it");
        return Ok(());
    }
    let owner = locker.holder(LOCK).await?.expect("the lock is held");
    let host = owner
        .field("host")
        .and_then(FieldValue::as_str)
        .expect("host published");
    let port = owner
        .field("port")
        .and_then(FieldValue::as_i64)
        // Any process that may write the lock directory wrote this record:
        // a port out of range is refused, not wrapped into another one.
        .and_then(|port| u16::try_from(port).ok())
        .expect("a port published");
    println!(
        "second instance (pid {}): {LOCK} is held by pid {:?}, serving on {host}:{port}",
        std::process::id(),
        owner.pid()
    );
    let mut stream = TcpStream::connect((host, port))
        .await
        .expect("connect to the server");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.expect("read the reply");
    print!("second instance: the server says: {reply}");
    assert!(reply.starts_with("hello from the server"));
    Ok(())
}
