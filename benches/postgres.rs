//! The PostgreSQL backend against its floors, each pair in the same run on
//! the same server (one the bench starts, on loopback: its Unix socket and
//! TCP on 127.0.0.1; or `LEASEHOLD_PG_URL`'s, then only that URL):
//!
//! - uncontended `acquire` + `release().await` against one
//!   `pg_try_advisory_lock` + `pg_advisory_unlock` round trip pair on the
//!   same connection (prepared statements: one round trip each, on the
//!   same client library);
//! - handoff between two processes (one's release to the other, which was
//!   waiting, holding) against a `LISTEN`/`NOTIFY` round trip between two
//!   processes (one's `NOTIFY` to its hearing the other's answering
//!   `NOTIFY`).
//!
//! ```text
//! cargo bench --features postgres --bench postgres
//! ```
//!
//! The bench re-runs its own binary as the child processes.

// The bench starts a PostgreSQL server of its own from Debian's binaries.
#[cfg(target_os = "linux")]
#[path = "../tests/support/pg_server.rs"]
mod pg_server;

#[cfg(target_os = "linux")]
fn main() {
    linux::main();
}

#[cfg(not(target_os = "linux"))]
fn main() {
    println!(
        "postgres: Linux only (it starts a PostgreSQL server of its own, and times processes on CLOCK_MONOTONIC)"
    );
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use leasehold::Locker;
    use nix::time::{ClockId, clock_gettime};
    use postgres::fallible_iterator::FallibleIterator;

    const ROLE: &str = "LEASEHOLD_BENCH_ROLE";
    /// Uncontended pairs timed, per function.
    const PAIRS: usize = 2000;
    /// Blocks the pairs are timed in, leasehold's and the floor's in turn,
    /// so that a change in the machine's state meets both alike.
    const BLOCKS: usize = 10;
    /// Turns taken by the two processes of a handoff, and `NOTIFY` round
    /// trips of the floor.
    const ROUNDS: usize = 400;

    /// CLOCK_MONOTONIC is one clock for every process on the machine.
    fn now_ns() -> u64 {
        let t = clock_gettime(ClockId::CLOCK_MONOTONIC).unwrap();
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    }

    fn percentiles(mut us: Vec<f64>) -> (f64, f64) {
        us.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (us[us.len() / 2], us[us.len() * 99 / 100])
    }

    pub(super) fn main() {
        if let Ok(role) = std::env::var(ROLE) {
            let url = std::env::args().nth(1).unwrap();
            child(&role, &url);
            return;
        }
        if std::env::args().any(|a| a == "--list") {
            return;
        }
        let server = match std::env::var("LEASEHOLD_PG_URL") {
            Ok(_) => super::pg_server::Server::start(),
            Err(_) => super::pg_server::Server::start_with(true, "", |_| {}),
        };
        let mut urls = vec![("Unix socket", server.url())];
        if server.external.is_some() {
            urls[0].0 = "LEASEHOLD_PG_URL";
        } else {
            urls.push((
                "TCP 127.0.0.1",
                format!(
                    "host=127.0.0.1 port={} user=postgres dbname=postgres",
                    server.port()
                ),
            ));
        }
        let version: String = server.sql(|c| c.query_one("SHOW server_version", &[]).unwrap().get(0));
        println!(
            "\nPostgreSQL {version}: {PAIRS} uncontended pairs, {ROUNDS} turns or round trips between two processes"
        );
        println!("| transport | scenario | median | p99 | median vs its floor |");
        println!("|---|---|---|---|---|");
        for (transport, url) in &urls {
            let (floor, leasehold) = uncontended(url);
            let (floor, leasehold) = (percentiles(floor), percentiles(leasehold));
            println!(
                "| {transport} | floor: `pg_try_advisory_lock` + `pg_advisory_unlock`, prepared, one connection | {:.0} µs | {:.0} µs | 1 |",
                floor.0, floor.1
            );
            println!(
                "| {transport} | uncontended `acquire` + `release().await` | {:.0} µs | {:.0} µs | **{:.1}x** |",
                leasehold.0,
                leasehold.1,
                leasehold.0 / floor.0
            );
            let notify = percentiles(notify_round_trips(url));
            let (handoff, count) = handoff_latency(url);
            let handoff = percentiles(handoff);
            println!(
                "| {transport} | floor: `LISTEN`/`NOTIFY` round trip between two processes | {:.0} µs | {:.0} µs | 1 |",
                notify.0, notify.1
            );
            println!(
                "| {transport} | handoff between two processes (release -> the waiter holds; {count} of {ROUNDS}) | {:.0} µs | {:.0} µs | **{:.1}x** (p99 {:.1}x) |",
                handoff.0,
                handoff.1,
                handoff.0 / notify.0,
                handoff.1 / notify.1
            );
        }
    }

    /// Microseconds per pair: the floor's (a synchronous client on a thread
    /// of its own, as leasehold's session thread is) and leasehold's (one
    /// `Locker` on a 2-worker runtime), timed in alternate blocks.
    fn uncontended(url: &str) -> (Vec<f64>, Vec<f64>) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let locker = rt.block_on(async {
            Locker::builder()
                .postgres(url)
                .poll_interval(Duration::from_secs(1))
                .build()
                .unwrap()
        });
        let url = url.to_owned();
        let floor_client = std::thread::spawn(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let lock = client.prepare("SELECT pg_try_advisory_lock($1)").unwrap();
            let unlock = client.prepare("SELECT pg_advisory_unlock($1)").unwrap();
            (client, lock, unlock)
        })
        .join()
        .unwrap();
        let floor_client = std::sync::Arc::new(std::sync::Mutex::new(floor_client));
        let floor_block = |n: usize| -> Vec<f64> {
            let client = std::sync::Arc::clone(&floor_client);
            std::thread::spawn(move || {
                let (client, lock, unlock) = &mut *client.lock().unwrap();
                let key = 42_i64;
                (0..n)
                    .map(|_| {
                        let started = Instant::now();
                        assert!(client.query_one(&*lock, &[&key]).unwrap().get::<_, bool>(0));
                        assert!(client.query_one(&*unlock, &[&key]).unwrap().get::<_, bool>(0));
                        started.elapsed().as_secs_f64() * 1e6
                    })
                    .collect()
            })
            .join()
            .unwrap()
        };
        let leasehold_block = |n: usize| -> Vec<f64> {
            rt.block_on(async {
                let mut us = Vec::with_capacity(n);
                for _ in 0..n {
                    let started = Instant::now();
                    locker.acquire("bench").await.unwrap().release().await.unwrap();
                    us.push(started.elapsed().as_secs_f64() * 1e6);
                }
                us
            })
        };
        // Warm-up: connections, the owner tables' pages, the code.
        floor_block(PAIRS / BLOCKS);
        leasehold_block(PAIRS / BLOCKS);
        let (mut floor, mut leasehold) = (Vec::new(), Vec::new());
        for _ in 0..BLOCKS {
            floor.extend(floor_block(PAIRS / BLOCKS));
            leasehold.extend(leasehold_block(PAIRS / BLOCKS));
        }
        (floor, leasehold)
    }

    fn spawn(role: &str, url: &str) -> std::process::Child {
        Command::new(std::env::current_exe().unwrap())
            .arg(url)
            .env(ROLE, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Microseconds from this process's `NOTIFY` to its hearing the answer
    /// of an echoing child: both processes asleep in between, as a
    /// handoff's waiter is.
    fn notify_round_trips(url: &str) -> Vec<f64> {
        let mut echo = spawn("echo", url);
        let mut from_echo = BufReader::new(echo.stdout.take().unwrap());
        let url = url.to_owned();
        let trips = std::thread::spawn(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            client.batch_execute("LISTEN leasehold_bench_pong").unwrap();
            // The echo listens.
            let mut ready = String::new();
            from_echo.read_line(&mut ready).unwrap();
            assert_eq!(ready.trim(), "ready");
            let mut trips = Vec::with_capacity(ROUNDS);
            for round in 0..ROUNDS + 20 {
                std::thread::sleep(Duration::from_millis(3));
                let started = Instant::now();
                client.batch_execute("NOTIFY leasehold_bench_ping").unwrap();
                let pong = client.notifications().blocking_iter().next().unwrap().unwrap();
                let us = started.elapsed().as_secs_f64() * 1e6;
                assert_eq!(pong.channel(), "leasehold_bench_pong");
                // The first rounds warm up.
                if round >= 20 {
                    trips.push(us);
                }
            }
            trips
        })
        .join()
        .unwrap();
        assert!(echo.wait().unwrap().success());
        trips
    }

    /// Two processes take turns on one name: each holds it 3 ms, releases,
    /// pauses 1 ms and asks again. Each acquisition is paired with the
    /// other process's release just before it; only acquisitions that had
    /// started waiting before that release count (an acquirer that came
    /// after it measures its own schedule, not the handoff).
    fn handoff_latency(url: &str) -> (Vec<f64>, usize) {
        let mut a = spawn("pingpong", url);
        let mut b = spawn("pingpong", url);
        let mut events: Vec<(u64, char, u32)> = Vec::new();
        // Both are connected before either starts to take turns.
        for child in [&mut a, &mut b] {
            let mut ready = String::new();
            BufReader::new(child.stdout.as_mut().unwrap())
                .read_line(&mut ready)
                .unwrap();
            assert_eq!(ready.trim(), "ready");
        }
        for child in [&mut a, &mut b] {
            drop(child.stdin.take());
        }
        for (child, id) in [(&mut a, 0), (&mut b, 1)] {
            for line in BufReader::new(child.stdout.take().unwrap()).lines() {
                let line = line.unwrap();
                let (kind, t) = line.split_once(' ').unwrap();
                events.push((t.parse().unwrap(), kind.chars().next().unwrap(), id));
            }
        }
        assert!(a.wait().unwrap().success());
        assert!(b.wait().unwrap().success());
        events.sort();
        let mut last_release: Option<(u64, u32)> = None;
        let mut waiting_since = [None::<u64>; 2];
        let mut latencies = Vec::new();
        for (t, kind, who) in events {
            match kind {
                'W' => waiting_since[who as usize] = Some(t),
                'R' => last_release = Some((t, who)),
                _ => {
                    let since = waiting_since[who as usize].take();
                    if let Some((r, by)) = last_release.take()
                        && by != who
                        && since.is_some_and(|w| w < r)
                    {
                        latencies.push((t - r) as f64 / 1000.0);
                    }
                }
            }
        }
        assert!(
            latencies.len() >= ROUNDS / 2,
            "only {} of {ROUNDS} acquisitions were handoffs to a waiting process",
            latencies.len()
        );
        let count = latencies.len();
        (latencies, count)
    }

    fn child(role: &str, url: &str) {
        match role {
            "echo" => {
                let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
                client.batch_execute("LISTEN leasehold_bench_ping").unwrap();
                println!("ready");
                for _ in 0..ROUNDS + 20 {
                    let ping = client.notifications().blocking_iter().next().unwrap().unwrap();
                    assert_eq!(ping.channel(), "leasehold_bench_ping");
                    client.batch_execute("NOTIFY leasehold_bench_pong").unwrap();
                }
            }
            "pingpong" => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let locker = Locker::builder()
                        .postgres(url)
                        .poll_interval(Duration::from_secs(1))
                        .build()
                        .unwrap();
                    // Connected, the tables made, the code warm.
                    locker.acquire("warm-up").await.unwrap().release().await.unwrap();
                    println!("ready");
                    // Go when the bench closes our stdin: both are ready.
                    let mut rest = String::new();
                    std::io::stdin().read_line(&mut rest).unwrap();
                    let mut out = String::new();
                    for _ in 0..ROUNDS / 2 {
                        out.push_str(&format!("W {}\n", now_ns()));
                        let g = locker.acquire("pingpong").await.unwrap();
                        out.push_str(&format!("A {}\n", now_ns()));
                        // Held longer than the pause below, so the other
                        // process is already waiting when this one releases.
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        let t = now_ns();
                        drop(g);
                        out.push_str(&format!("R {t}\n"));
                        // Let the other process, which is waiting, take it.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    print!("{out}");
                });
            }
            _ => unreachable!("unknown role"),
        }
    }
}
