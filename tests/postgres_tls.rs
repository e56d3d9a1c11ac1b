//! TLS to PostgreSQL (feature `postgres-tls`), against real servers the
//! tests start with `ssl = on` (or off), on 127.0.0.1, with a certificate
//! authority and server certificates the tests make (rcgen): each
//! `sslmode` checks what libpq's does, and none that asks for TLS ever
//! connects in clear text. What each connection of a `Locker` used is read
//! from the server's `pg_stat_ssl`, through the connections' own
//! `application_name`.
// Each test starts a PostgreSQL server of its own from Debian's binaries.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasehold::{Error, Locker, LockerBuilder, PgSslMode};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

#[path = "support/pg_server.rs"]
mod pg_server;

use pg_server::Server;

/// A certificate authority of the test's own, and its PEM file.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pem: PathBuf,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pem = dir.join(format!("{name}.pem"));
        std::fs::write(&pem, issuer.pem()).unwrap();
        Ca { issuer, pem }
    }

    /// A server certificate for `names`, and its key, in PEM.
    fn server_cert(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "leasehold test server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A server listening on 127.0.0.1 with `ssl = on` and a certificate for
/// `names` signed by `ca` (or with `ssl = off`, if `ca` is `None`).
fn server(ca: Option<(&Ca, &[&str])>) -> Server {
    let Some((ca, names)) = ca else {
        return Server::start_with(true, "-c ssl=off", |_| {});
    };
    let (cert, key) = ca.server_cert(names);
    Server::start_with(
        true,
        "-c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key",
        |data| {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::write(data.join("server.crt"), cert).unwrap();
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(data.join("server.key"))
                .unwrap();
            std::io::Write::write_all(&mut file, key.as_bytes()).unwrap();
        },
    )
}

/// A connection string to `server` over TCP at `host`, with a unique
/// `application_name` (returned) to find the `Locker`'s connections by.
fn conninfo(server: &Server, host: &str, more: &str) -> (String, String) {
    let app = format!("tls-{}", uuid::Uuid::new_v4().simple());
    (
        format!(
            "host={host} port={} user=postgres dbname=postgres application_name={app} {more}",
            server.port()
        ),
        app,
    )
}

fn builder(url: &str) -> LockerBuilder {
    Locker::builder()
        .postgres(url)
        .lease(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(50))
}

/// Whether each connection named `app` uses TLS, once there are `n` of
/// them (the session, and the listener, which connects on its own thread).
fn ssl_of(server: &Server, app: &str, n: usize) -> Vec<bool> {
    let since = Instant::now();
    loop {
        let app = app.to_owned();
        let found: Vec<bool> = server.sql(move |c| {
            c.query(
                "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                  WHERE a.application_name = $1",
                &[&app],
            )
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
        });
        if found.len() >= n || since.elapsed() > Duration::from_secs(10) {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The error and its causes, on one line.
fn said(error: &Error) -> String {
    format!("{error:?}")
}

/// A `Locker` that cannot be built, and why.
async fn refused(builder: LockerBuilder) -> Error {
    let built = tokio::task::spawn_blocking(move || builder.build())
        .await
        .unwrap();
    match built {
        Ok(_) => panic!("the Locker was built"),
        Err(error) => error,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_right_ca_and_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let server = server(Some((&ca, &["localhost"])));
    let (url, app) = conninfo(
        &server,
        "localhost",
        &format!("sslmode=verify-full sslrootcert={}", ca.pem.display()),
    );
    let locker = builder(&url).build().unwrap();
    let guard = locker.acquire("tls").await.unwrap();
    assert!(guard.fencing_token().is_some());
    assert_eq!(
        ssl_of(&server, &app, 2),
        [true, true],
        "the session and the listener both use TLS"
    );
    guard.release().await.unwrap();

    // The same through the builder's own settings, over a URL that says
    // nothing of TLS.
    let (url, app) = conninfo(&server, "localhost", "");
    let locker = builder(&url)
        .postgres_ssl_mode(PgSslMode::VerifyFull)
        .postgres_root_cert(&ca.pem)
        .build()
        .unwrap();
    drop(locker.acquire("tls").await.unwrap());
    assert_eq!(ssl_of(&server, &app, 2), [true, true]);

    // And the URL form, its root certificate percent-encoded.
    let app = format!("tls-{}", uuid::Uuid::new_v4().simple());
    let encoded = ca.pem.display().to_string().replace('/', "%2F");
    let url = format!(
        "postgresql://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={encoded}&application_name={app}",
        server.port()
    );
    let locker = builder(&url).build().unwrap();
    drop(locker.acquire("tls").await.unwrap());
    assert_eq!(ssl_of(&server, &app, 2), [true, true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let stranger = Ca::new(dir.path(), "stranger");
    let server = server(Some((&ca, &["localhost"])));
    // `require` given a root certificate checks the chain, as libpq.
    for mode in ["verify-full", "verify-ca", "require"] {
        let (url, app) = conninfo(
            &server,
            "localhost",
            &format!("sslmode={mode} sslrootcert={}", stranger.pem.display()),
        );
        let error = refused(builder(&url)).await;
        assert!(
            matches!(
                error,
                Error::Backend {
                    op: "connect to PostgreSQL",
                    ..
                }
            ),
            "{mode}: {}",
            said(&error)
        );
        assert!(
            said(&error).contains("UnknownIssuer"),
            "{mode}: says why: {}",
            said(&error)
        );
        assert!(ssl_of(&server, &app, 0).is_empty(), "{mode}: no connection left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_for_another_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let server = server(Some((&ca, &["db.example"])));
    let (bad, _) = conninfo(
        &server,
        "localhost",
        &format!("sslmode=verify-full sslrootcert={}", ca.pem.display()),
    );
    let error = refused(builder(&bad)).await;
    assert!(
        matches!(
            error,
            Error::Backend {
                op: "connect to PostgreSQL",
                ..
            }
        ),
        "{}",
        said(&error)
    );
    assert!(
        said(&error).contains("not valid for name"),
        "says why: {}",
        said(&error)
    );

    // An address the certificate does not name either.
    let (bad, _) = conninfo(
        &server,
        "127.0.0.1",
        &format!("sslmode=verify-full sslrootcert={}", ca.pem.display()),
    );
    assert!(said(&refused(builder(&bad)).await).contains("not valid for name"));

    // verify-ca checks the chain only: the same server is good for it.
    let (url, app) = conninfo(
        &server,
        "localhost",
        &format!("sslmode=verify-ca sslrootcert={}", ca.pem.display()),
    );
    let locker = builder(&url).build().unwrap();
    drop(locker.acquire("tls").await.unwrap());
    assert_eq!(ssl_of(&server, &app, 2), [true, true]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_never_falls_back_to_clear_text() {
    // A server without TLS: `require` (and the verify modes) fail, where
    // `prefer` connects in clear text, as libpq's would.
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let plain = server(None);
    for more in [
        "sslmode=require".to_owned(),
        format!("sslmode=verify-full sslrootcert={}", ca.pem.display()),
    ] {
        let (url, app) = conninfo(&plain, "localhost", &more);
        let error = refused(builder(&url)).await;
        assert!(
            matches!(
                error,
                Error::Backend {
                    op: "connect to PostgreSQL",
                    ..
                }
            ),
            "{more}: {}",
            said(&error)
        );
        assert!(
            said(&error).contains("TLS"),
            "{more}: says the server has no TLS: {}",
            said(&error)
        );
        assert!(
            ssl_of(&plain, &app, 0).is_empty(),
            "{more}: not connected in clear"
        );
    }
    let (url, app) = conninfo(&plain, "localhost", "sslmode=prefer");
    let locker = builder(&url).build().unwrap();
    drop(locker.acquire("clear").await.unwrap());
    assert_eq!(ssl_of(&plain, &app, 2), [false, false]);
    drop(locker);

    // With TLS on the server: `require` without a root certificate
    // encrypts (unverified, as libpq), `prefer` too, `disable` does not.
    let tls = server(Some((&ca, &["db.example"])));
    for (mode, ssl) in [("require", true), ("prefer", true), ("disable", false)] {
        let (url, app) = conninfo(&tls, "localhost", &format!("sslmode={mode}"));
        let locker = builder(&url).build().unwrap();
        let guard = locker.acquire("mode").await.unwrap();
        assert_eq!(ssl_of(&tls, &app, 2), [ssl, ssl], "{mode}");
        guard.release().await.unwrap();
    }

    // An upgradable holding's own session too.
    let (url, app) = conninfo(&tls, "localhost", "sslmode=require");
    let locker = builder(&url).build().unwrap();
    let upgradable = locker.acquire_upgradable("up").await.unwrap();
    assert_eq!(ssl_of(&tls, &app, 3), [true, true, true]);
    let exclusive = upgradable.upgrade().await.unwrap();
    exclusive.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_settings_are_refused_by_build() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    for root in [&missing, &garbage] {
        let error = Locker::builder()
            .postgres("host=localhost port=1 user=postgres sslmode=verify-full")
            .postgres_root_cert(root)
            .build()
            .unwrap_err();
        assert!(matches!(error, Error::InvalidConfig { .. }), "{}", said(&error));
        assert!(said(&error).contains("root certificate"), "{}", said(&error));
    }
    let error = Locker::builder()
        .postgres("host=localhost port=1 user=postgres sslmode=verify_full")
        .build()
        .unwrap_err();
    assert!(matches!(error, Error::InvalidConfig { .. }), "{}", said(&error));
    let error = Locker::builder()
        .postgres_ssl_mode(PgSslMode::Require)
        .build()
        .unwrap_err();
    assert!(matches!(error, Error::InvalidConfig { .. }), "{}", said(&error));
}
