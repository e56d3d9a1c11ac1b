//! A throwaway PgBouncer in front of a test's PostgreSQL server: a
//! generated ini and userlist in a temporary directory, listening on a
//! free loopback port, run in the foreground (as the `postgres` user when
//! we are root: PgBouncer refuses root) and killed by pid when dropped.
#![allow(dead_code)]

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::pg_server::Server;

/// The `pgbouncer` binary (Debian's package installs it in /usr/sbin).
/// `None`, with the reason printed, when it is absent and `CI` is unset;
/// under `CI` a missing binary fails the test.
pub fn binary_or_skip() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|dir| dir.join("pgbouncer"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no pgbouncer binary, and CI is set: install it (apt-get install pgbouncer)"
        );
        eprintln!("skipped: no pgbouncer binary (apt-get install pgbouncer to run this test)");
    }
    found
}

/// A PgBouncer of the test's own, in `pool_mode` `mode`.
pub struct Bouncer {
    child: Child,
    port: u16,
    user: String,
    dbname: String,
    dir: tempfile::TempDir,
}

impl Bouncer {
    /// Starts PgBouncer (`binary`) in front of `server`, in pool mode
    /// `mode` (`session`, `transaction`, `statement`) with `pool_size`
    /// server connections per database and user; returns once it accepts
    /// connections.
    pub fn start(binary: &PathBuf, server: &Server, mode: &str, pool_size: u32) -> Bouncer {
        Self::start_with(binary, server, mode, pool_size, "")
    }

    /// As [`start`](Self::start), with `extra` lines in its `[pgbouncer]`
    /// section.
    pub fn start_with(binary: &PathBuf, server: &Server, mode: &str, pool_size: u32, extra: &str) -> Bouncer {
        let config: postgres::Config = server.url().parse().unwrap();
        let host = match &config.get_hosts()[0] {
            postgres::config::Host::Tcp(host) => host.clone(),
            postgres::config::Host::Unix(path) => path.display().to_string(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config.get_user().unwrap_or("postgres").to_owned();
        let dbname = config.get_dbname().unwrap_or(&user).to_owned();
        let password = config
            .get_password()
            .map(|p| format!(" password={}", String::from_utf8_lossy(p)))
            .unwrap_or_default();
        let dir = tempfile::tempdir().unwrap();
        let listen = {
            let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            probe.local_addr().unwrap().port()
        };
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host={host} port={port} user={user}{password}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {listen}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {userlist}\n\
                 pool_mode = {mode}\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 200\n\
                 logfile = {log}\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 {extra}\n",
                userlist = dir.path().join("userlist.txt").display(),
                log = dir.path().join("pgbouncer.log").display(),
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("userlist.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        let mut command = Command::new(binary);
        command
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if nix::unistd::geteuid().is_root() {
            use std::os::unix::process::CommandExt;
            let pg = nix::unistd::User::from_name("postgres")
                .unwrap()
                .expect("a postgres user to run PgBouncer as (it refuses root)");
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown PgBouncer's directory to postgres");
            command.uid(pg.uid.as_raw()).gid(pg.gid.as_raw());
        }
        let child = command.spawn().expect("start pgbouncer");
        let mut bouncer = Bouncer {
            child,
            port: listen,
            user,
            dbname,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, listen)).is_err() {
            if let Ok(Some(status)) = bouncer.child.try_wait() {
                panic!("pgbouncer exited ({status}): {}", bouncer.log());
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer never listened: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bouncer
    }

    /// The connection string of the pooler.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={} dbname={}",
            self.port, self.user, self.dbname
        )
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    /// Stops PgBouncer (SIGTERM, then SIGKILL after two seconds) and reaps it.
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
