//! A throwaway PostgreSQL server for the tests and the benchmark: initdb
//! in a temporary directory, a Unix socket only, started and stopped with
//! `pg_ctl` (as the unprivileged `postgres` user when we are root), unless
//! `LEASEHOLD_PG_URL` names a server to use instead.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A PostgreSQL server of the test's own, stopped (by pid) when dropped.
pub struct Server {
    /// The postmaster's pid, while it runs.
    pid: Option<i32>,
    data: PathBuf,
    socket: PathBuf,
    _dir: tempfile::TempDir,
    pub external: Option<String>,
    /// The server's port (its socket's name too).
    port: u16,
    /// More `postgres` options (`-c name=value`), for `start_with`.
    options: String,
}

fn pg_binary(name: &str) -> PathBuf {
    if let Ok(out) = Command::new("which").arg(name).output()
        && out.status.success()
    {
        return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| {
            dirs.filter_map(|d| d.ok())
                .map(|d| d.path().join("bin").join(name))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().filter(|p| p.exists()).unwrap_or_else(|| {
        panic!("no `{name}` found: install PostgreSQL (apt-get install postgresql) or set LEASEHOLD_PG_URL")
    })
}

/// Runs a PostgreSQL program, as `postgres` when we are root (initdb and
/// the server refuse to run as root).
fn as_pg_user(program: &Path) -> Command {
    if nix::unistd::geteuid().is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

impl Server {
    pub fn start() -> Server {
        if let Ok(url) = std::env::var("LEASEHOLD_PG_URL") {
            return Server {
                pid: None,
                data: PathBuf::new(),
                socket: PathBuf::new(),
                _dir: tempfile::tempdir().unwrap(),
                external: Some(url),
                port: 5432,
                options: String::new(),
            };
        }
        Server::start_with(false, "", |_| {})
    }

    /// A server of the test's own (never `LEASEHOLD_PG_URL`'s), also
    /// listening on 127.0.0.1 at a free port if `tcp`, started with
    /// `options` (`-c name=value ...`) once `setup` has been given its data
    /// directory (for files such as certificates, which then belong to the
    /// server's user).
    pub fn start_with(tcp: bool, options: &str, setup: impl FnOnce(&Path)) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let socket = dir.path().join("socket");
        std::fs::create_dir(&socket).unwrap();
        if nix::unistd::geteuid().is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown the server's directory to postgres");
        }
        let out = as_pg_user(&pg_binary("initdb"))
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        setup(&data);
        if nix::unistd::geteuid().is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&data)
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown the server's files to postgres");
        }
        let (port, listen) = if tcp {
            let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            (free.local_addr().unwrap().port(), "127.0.0.1")
        } else {
            (5432, "")
        };
        let mut server = Server {
            pid: None,
            data,
            socket,
            _dir: dir,
            external: None,
            port,
            options: format!("-c listen_addresses={listen} {options}"),
        };
        server.run();
        server
    }

    /// Starts the server with pg_ctl, which returns once it accepts
    /// connections; its pid is then in `postmaster.pid`.
    fn run(&mut self) {
        let options = format!(
            "-k {} -c fsync=off -p {} {}",
            self.socket.display(),
            self.port,
            self.options
        );
        let out = as_pg_user(&pg_binary("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-o", &options, "-w", "-t", "30", "-l"])
            .arg(self.data.join("server.log"))
            .arg("start")
            .output()
            .expect("run pg_ctl start");
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pidfile = std::fs::read_to_string(self.data.join("postmaster.pid")).expect("postmaster.pid");
        self.pid = pidfile.lines().next().and_then(|l| l.trim().parse().ok());
        assert!(self.pid.is_some(), "no pid in postmaster.pid");
    }

    /// The postmaster's pid, while the server runs (`None` for a server
    /// named by `LEASEHOLD_PG_URL`).
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    pub fn url(&self) -> String {
        match &self.external {
            Some(url) => url.clone(),
            None => format!(
                "host={} port={} user=postgres dbname=postgres",
                self.socket.display(),
                self.port
            ),
        }
    }

    /// The port of a server started with `tcp` (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs `query` on a connection of its own (the synchronous client
    /// cannot run on a thread that drives the test's runtime).
    pub fn sql<T: Send + 'static>(
        &self,
        query: impl FnOnce(&mut postgres::Client) -> T + Send + 'static,
    ) -> T {
        off_runtime(self.url(), move |url| {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            query(&mut client)
        })
    }

    /// Stops the server (fast shutdown), waiting for it to be gone; kills
    /// it by pid if it will not stop.
    fn stop(&mut self) {
        let Some(pid) = self.pid.take() else { return };
        let stopped = as_pg_user(&pg_binary("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-t", "30", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }

    pub fn restart(&mut self) {
        assert!(self.external.is_none(), "cannot restart an external server");
        self.stop();
        self.run();
    }
}

impl Server {
    /// What clients left on the server: advisory locks or client sessions
    /// still there `within` after they all ended (none of them counted
    /// on a server named by `LEASEHOLD_PG_URL`, which may have other
    /// clients). Each finding is a line of text.
    pub fn advisory_locks_and_sessions_left(&self, within: std::time::Duration) -> Vec<String> {
        let since = std::time::Instant::now();
        let (locks, sessions) = loop {
            if self.external.is_some() {
                break (0, 0);
            }
            let (locks, sessions): (i64, i64) = self.sql(|c| {
                let row = c
                    .query_one(
                        "SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'),
                                (SELECT count(*) FROM pg_stat_activity
                                  WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())",
                        &[],
                    )
                    .unwrap();
                (row.get(0), row.get(1))
            });
            if (locks == 0 && sessions == 0) || since.elapsed() >= within {
                break (locks, sessions);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let mut left = Vec::new();
        if locks > 0 {
            left.push(format!(
                "{locks} advisory locks held {within:?} after the last client ended"
            ));
        }
        if sessions > 0 {
            left.push(format!(
                "{sessions} client sessions open {within:?} after the last client ended"
            ));
        }
        left
    }
}

/// A connection on a thread of its own that increments the counter row
/// on request, with no row lock: a read, then a write.
pub struct SqlWorker {
    requests: std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>,
}

impl SqlWorker {
    pub fn start(url: String, table: String) -> Self {
        let (requests, rx) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>();
        std::thread::spawn(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            for done in rx {
                let n: i64 = client
                    .query_one(&format!("SELECT n FROM {table}"), &[])
                    .unwrap()
                    .get(0);
                client
                    .execute(&format!("UPDATE {table} SET n = $1"), &[&(n + 1)])
                    .unwrap();
                let _ = done.send(());
            }
        });
        Self { requests }
    }

    pub async fn increment(&self) {
        let (done, finished) = tokio::sync::oneshot::channel();
        self.requests.send(done).unwrap();
        finished.await.unwrap();
    }
}

fn off_runtime<T: Send + 'static>(url: String, f: impl FnOnce(String) -> T + Send + 'static) -> T {
    std::thread::spawn(move || f(url)).join().unwrap()
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Ends one client session of the server at `url` (as a DBA's
/// `pg_terminate_backend`, a crashed backend or a restart would), most
/// often one that holds an advisory lock, so that holders lose their
/// sessions mid-section; `pick(n)` chooses one of `n` (below `n`), and is
/// also asked (`pick(4)`) whether to take any client session instead.
/// Returns 1 if a session was ended.
pub fn terminate_a_session(url: &str, pick: &mut dyn FnMut(u64) -> u64) -> usize {
    let Ok(mut client) = postgres::Client::connect(url, postgres::NoTls) else {
        return 0;
    };
    let holders = "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()";
    let any =
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";
    let pids = |client: &mut postgres::Client, query: &str| -> Vec<i32> {
        client
            .query(query, &[])
            .map(|rows| rows.iter().map(|r| r.get(0)).collect())
            .unwrap_or_default()
    };
    let mut found = if pick(4) == 0 {
        Vec::new()
    } else {
        pids(&mut client, holders)
    };
    if found.is_empty() {
        found = pids(&mut client, any);
    }
    if found.is_empty() {
        return 0;
    }
    let pid = found[pick(found.len() as u64) as usize];
    client
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .map_or(0, |row| usize::from(row.get::<_, bool>(0)))
}
