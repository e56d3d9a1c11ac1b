//! The PostgreSQL backend on loopback (a Unix socket to a throwaway server,
//! or `LEASEHOLD_PG_URL`): uncontended acquire + release, and handoff
//! latency between two `Locker`s with connections of their own.
//!
//! ```text
//! cargo bench --features postgres --bench postgres
//! ```

// The bench starts a PostgreSQL server of its own from Debian's binaries.
#[cfg(unix)]
#[path = "../tests/support/pg_server.rs"]
mod pg_server;

#[cfg(unix)]
fn main() {
    unix::main();
}

#[cfg(not(unix))]
fn main() {
    println!("postgres: Unix only (it starts a PostgreSQL server of its own)");
}

#[cfg(unix)]
mod unix {

    use std::time::{Duration, Instant};

    use leasehold::Locker;

    const ROUNDS: usize = 300;

    fn percentiles(mut us: Vec<f64>) -> (f64, f64) {
        us.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (us[us.len() / 2], us[us.len() * 99 / 100])
    }

    pub(super) fn main() {
        if std::env::args().any(|a| a == "--list") {
            return;
        }
        let server = super::pg_server::Server::start();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (uncontended, handoff) = rt.block_on(async {
            let build = || {
                Locker::builder()
                    .postgres(server.url())
                    .poll_interval(Duration::from_secs(1))
                    .build()
                    .unwrap()
            };
            let (a, b) = (build(), build());

            let mut uncontended = Vec::new();
            for _ in 0..ROUNDS {
                let started = Instant::now();
                a.acquire("bench").await.unwrap().release().await.unwrap();
                uncontended.push(started.elapsed().as_secs_f64() * 1e6);
            }

            // B waits while A holds; A releases; how long until B holds?
            let mut handoff = Vec::new();
            for _ in 0..ROUNDS / 3 {
                let held = a.acquire("handoff").await.unwrap();
                let waiter = {
                    let b = b.clone();
                    tokio::spawn(async move {
                        let g = b.acquire("handoff").await.unwrap();
                        let at = Instant::now();
                        g.release().await.unwrap();
                        at
                    })
                };
                tokio::time::sleep(Duration::from_millis(20)).await;
                let released = Instant::now();
                held.release().await.unwrap();
                let acquired = waiter.await.unwrap();
                handoff.push(acquired.duration_since(released).as_secs_f64() * 1e6);
            }
            (percentiles(uncontended), percentiles(handoff))
        });
        println!("\nPostgreSQL backend ({ROUNDS} rounds, Unix socket)");
        println!("| scenario | median | p99 |");
        println!("|---|---|---|");
        println!(
            "| uncontended acquire + release | {:.0} µs | {:.0} µs |",
            uncontended.0, uncontended.1
        );
        println!(
            "| handoff between two Lockers (release -> other holds) | {:.0} µs | {:.0} µs |",
            handoff.0, handoff.1
        );
    }
}
