//! How a `Locker` reaches its server: the client's settings (from a URL
//! or the application's own `postgres::Config`), with libpq's `sslmode`
//! and `sslrootcert`, which the client's own parser does not know in full.
//!
//! Every connection of a `Locker` (its session, its listener, the session
//! of each upgradable holding) is made here, with the same settings, so
//! none of them goes in clear text where TLS was asked for.

use std::fmt;
use std::path::PathBuf;

use postgres::config::SslMode as ClientSslMode;
use postgres::{Client, Config, NoTls};

use crate::error::{Error, Result};

/// libpq's `sslmode`: whether the connections to PostgreSQL use TLS, and
/// what they check of the server's certificate. Set it in the connection
/// string (`sslmode=verify-full`) or with
/// [`LockerBuilder::postgres_ssl_mode`](crate::LockerBuilder::postgres_ssl_mode),
/// which wins over the string.
///
/// Every mode but `Disable` and `Prefer` needs the feature
/// `postgres-tls`; without it, [`build`](crate::LockerBuilder::build)
/// refuses them with [`Error::Unsupported`] rather than connect in clear
/// text. With TLS, `Require`, `VerifyCa` and `VerifyFull` never fall back
/// to clear text: a server that does not offer TLS is an error.
///
/// # Examples
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// use leasehold::{Error, Locker, PgSslMode};
///
/// let built = Locker::builder()
///     .postgres("host=db.internal user=app")
///     .postgres_ssl_mode(PgSslMode::VerifyFull)
///     .build();
/// // Refused before any connection is tried: without the feature
/// // `postgres-tls` (`Unsupported`), or with it for want of a root
/// // certificate to check the server's against (`InvalidConfig`).
/// assert!(matches!(
///     built,
///     Err(Error::Unsupported { .. } | Error::InvalidConfig { .. })
/// ));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PgSslMode {
    /// Clear text only.
    Disable,
    /// TLS if the server offers it, clear text if not; the certificate is
    /// checked only if a root certificate is given (as libpq). The
    /// client's default.
    #[default]
    Prefer,
    /// TLS or no connection. The certificate is not checked (the
    /// connection is encrypted, but a man in the middle could answer)
    /// unless a root certificate is given: then its chain is, as with
    /// `VerifyCa` (as libpq).
    Require,
    /// TLS, and a certificate chain that leads to the given root
    /// certificate; the host name is not checked.
    VerifyCa,
    /// TLS, a certificate chain that leads to the given root certificate,
    /// and a certificate for the host name connected to. What a managed
    /// database should be reached with.
    VerifyFull,
}

impl PgSslMode {
    fn parse(value: &str) -> Result<PgSslMode> {
        Ok(match value {
            "disable" => PgSslMode::Disable,
            // libpq's `allow` tries clear text first; it is never more
            // than `prefer` here, and never asked for TLS only.
            "allow" | "prefer" => PgSslMode::Prefer,
            "require" => PgSslMode::Require,
            "verify-ca" => PgSslMode::VerifyCa,
            "verify-full" => PgSslMode::VerifyFull,
            other => {
                return Err(Error::InvalidConfig {
                    reason: format!(
                        "sslmode={other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                    ),
                });
            }
        })
    }

    /// TLS or nothing.
    #[cfg_attr(all(feature = "postgres-tls", not(test)), allow(dead_code))]
    fn demands_tls(self) -> bool {
        matches!(
            self,
            PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull
        )
    }
}

#[cfg(feature = "postgres-tls")]
pub(super) use PgSslMode as SslMode;

/// The root certificates a TLS connection trusts (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// A PEM file of one or more certificates.
    File(PathBuf),
    /// The platform's store (`sslrootcert=system`).
    System,
}

impl RootCert {
    fn parse(value: &str) -> RootCert {
        if value == "system" {
            RootCert::System
        } else {
            RootCert::File(PathBuf::from(value))
        }
    }

    /// libpq's default, `~/.postgresql/root.crt`
    /// (`%APPDATA%\postgresql\root.crt` on Windows), if it exists.
    fn default_file() -> Option<RootCert> {
        #[cfg(windows)]
        let file = PathBuf::from(std::env::var_os("APPDATA")?)
            .join("postgresql")
            .join("root.crt");
        #[cfg(not(windows))]
        let file = PathBuf::from(std::env::var_os("HOME")?)
            .join(".postgresql")
            .join("root.crt");
        file.is_file().then_some(RootCert::File(file))
    }
}

/// Where the builder's server settings came from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A connection string or URL.
    Url(String),
    /// The application's own client settings.
    Config(Box<Config>),
}

/// The builder's TLS settings, which win over the source's.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsSettings {
    pub(crate) mode: Option<PgSslMode>,
    pub(crate) root_cert: Option<PathBuf>,
}

/// What `pg_stat_activity` shows of a `Locker`'s connections unless the
/// application names them.
pub(crate) const APPLICATION_NAME: &str = concat!("leasehold/", env!("CARGO_PKG_VERSION"));

/// The settings every connection of a `Locker` is made with.
#[derive(Clone)]
pub(crate) struct Target {
    config: Config,
    mode: PgSslMode,
    root: Option<RootCert>,
    #[cfg(feature = "postgres-tls")]
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

impl fmt::Debug for Target {
    // The client's own `Debug` leaves out the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("config", &self.config)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// The settings of `source` with `settings` over them; a TLS
    /// connector made at once, so that a missing root certificate is
    /// reported by `build()`, not at the first connection.
    pub(crate) fn new(source: &Source, settings: &TlsSettings) -> Result<Target> {
        let (mut config, mut mode, mut root) = match source {
            Source::Url(url) => {
                let split = split_ssl(url)?;
                let config: Config = split.rest.parse().map_err(|e| Error::Backend {
                    op: "parse the PostgreSQL connection string",
                    source: Box::new(e),
                })?;
                let mode = split.mode.as_deref().map(PgSslMode::parse).transpose()?;
                (config, mode, split.root.as_deref().map(RootCert::parse))
            }
            Source::Config(config) => {
                let mode = match config.get_ssl_mode() {
                    ClientSslMode::Disable => PgSslMode::Disable,
                    ClientSslMode::Require => PgSslMode::Require,
                    _ => PgSslMode::Prefer,
                };
                ((**config).clone(), Some(mode), None)
            }
        };
        if let Some(set) = settings.mode {
            mode = Some(set);
        }
        if let Some(file) = &settings.root_cert {
            root = Some(if file.as_os_str() == "system" {
                RootCert::System
            } else {
                RootCert::File(file.clone())
            });
        }
        let mode = mode.unwrap_or_default();
        if config.get_application_name().is_none() {
            config.application_name(APPLICATION_NAME);
        }
        // The client knows disable, prefer and require; the rest is the
        // connector's (see `tls.rs`). Required, the client never falls
        // back to clear text.
        config.ssl_mode(match mode {
            PgSslMode::Disable => ClientSslMode::Disable,
            PgSslMode::Prefer => ClientSslMode::Prefer,
            _ => ClientSslMode::Require,
        });
        #[cfg(not(feature = "postgres-tls"))]
        if mode.demands_tls() {
            return Err(Error::Unsupported {
                what: "TLS to PostgreSQL (sslmode=require, verify-ca or verify-full) without \
                       leasehold's feature `postgres-tls`: enable it, or the Locker would \
                       connect in clear text",
            });
        }
        if mode == PgSslMode::Disable {
            root = None;
        } else if root.is_none() {
            root = RootCert::default_file();
        }
        if matches!(mode, PgSslMode::VerifyCa | PgSslMode::VerifyFull) && root.is_none() {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "sslmode={} needs a root certificate to check the server's against: \
                     sslrootcert=<PEM file>, sslrootcert=system for the platform's store \
                     (or LockerBuilder::postgres_root_cert), or ~/.postgresql/root.crt, as libpq",
                    if mode == PgSslMode::VerifyCa {
                        "verify-ca"
                    } else {
                        "verify-full"
                    }
                ),
            });
        }
        #[cfg(feature = "postgres-tls")]
        {
            let tls = match mode {
                PgSslMode::Disable => None,
                _ => Some(super::tls::connector(mode, root.as_ref())?),
            };
            Ok(Target {
                config,
                mode,
                root,
                tls,
            })
        }
        #[cfg(not(feature = "postgres-tls"))]
        Ok(Target { config, mode, root })
    }

    /// Whether `other` connects as this does: to the same server and
    /// database, as the same user, with the same TLS settings.
    pub(crate) fn same_settings(&self, other: &Target) -> bool {
        // The client's settings have no `==`; their `Debug` shows every
        // one of them but the password.
        format!("{:?}", self.config) == format!("{:?}", other.config)
            && self.config.get_password() == other.config.get_password()
            && self.mode == other.mode
            && self.root == other.root
    }

    /// A new connection.
    pub(crate) fn connect(&self) -> std::result::Result<Client, postgres::Error> {
        self.connect_with(|config| config)
    }

    /// A new connection, with the settings `tune` makes of ours (the
    /// session's keepalives, see `session/stable.rs`).
    pub(crate) fn connect_with(
        &self,
        tune: impl FnOnce(Config) -> Config,
    ) -> std::result::Result<Client, postgres::Error> {
        let config = tune(self.config.clone());
        #[cfg(feature = "postgres-tls")]
        if let Some(tls) = &self.tls {
            return config.connect(tls.clone());
        }
        config.connect(NoTls)
    }

    /// TLS or nothing.
    #[cfg(test)]
    pub(crate) fn demands_tls(&self) -> bool {
        self.mode.demands_tls()
    }
}

/// A connection string without its `sslmode` and `sslrootcert`, and their
/// values (the last of each, as libpq).
#[derive(Debug, PartialEq, Eq)]
struct Split {
    rest: String,
    mode: Option<String>,
    root: Option<String>,
}

/// Takes `sslmode` and `sslrootcert` out of a connection string, in
/// either of libpq's forms, for the client's parser, which refuses
/// `verify-ca`, `verify-full` and `sslrootcert`.
fn split_ssl(url: &str) -> Result<Split> {
    let mut split = Split {
        rest: String::new(),
        mode: None,
        root: None,
    };
    let prefix = ["postgres://", "postgresql://"]
        .into_iter()
        .find(|prefix| url.starts_with(prefix));
    if prefix.is_some() {
        let (head, query) = match url.split_once('?') {
            Some((head, query)) => (head, Some(query)),
            None => (url, None),
        };
        let mut kept = Vec::new();
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            let (key, value) = param.split_once('=').unwrap_or((param, ""));
            match &*percent_decode(key)? {
                "sslmode" => split.mode = Some(percent_decode(value)?),
                "sslrootcert" => split.root = Some(percent_decode(value)?),
                _ => kept.push(param),
            }
        }
        split.rest = head.to_owned();
        if !kept.is_empty() {
            split.rest.push('?');
            split.rest.push_str(&kept.join("&"));
        }
        return Ok(split);
    }
    let mut rest = Vec::new();
    for (key, value) in key_values(url)? {
        match key.as_str() {
            "sslmode" => split.mode = Some(value),
            "sslrootcert" => split.root = Some(value),
            _ => rest.push(format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            )),
        }
    }
    split.rest = rest.join(" ");
    Ok(split)
}

fn bad_string(reason: &str) -> Error {
    Error::InvalidConfig {
        reason: format!("bad PostgreSQL connection string: {reason}"),
    }
}

/// The pairs of a `key=value` connection string, read as the client reads
/// them: values bare or in single quotes, `\` escaping the next character.
fn key_values(s: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(bad_string(&format!("expected `=` after {key:?}")));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => return Err(bad_string("unterminated quoted value")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err(bad_string(&format!("no value for {key:?}")));
            }
        }
        pairs.push((key, value));
    }
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad_string("a percent-encoded value is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, Option<&'static str>, Option<String>) {
        let s = split_ssl(url).unwrap();
        let mode = s.mode.map(|m| match m.as_str() {
            "verify-full" => "verify-full",
            "verify-ca" => "verify-ca",
            "require" => "require",
            "disable" => "disable",
            _ => "other",
        });
        (s.rest, mode, s.root)
    }

    #[test]
    fn ssl_settings_come_out_of_urls() {
        assert_eq!(
            split(
                "postgres://app:pw@db.example:5432/locks?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=5"
            ),
            (
                "postgres://app:pw@db.example:5432/locks?connect_timeout=5".into(),
                Some("verify-full"),
                Some("/etc/ca.pem".into())
            )
        );
        assert_eq!(
            split("postgresql://db/locks?sslmode=require"),
            ("postgresql://db/locks".into(), Some("require"), None)
        );
        assert_eq!(
            split("postgres://db/locks"),
            ("postgres://db/locks".into(), None, None)
        );
    }

    #[test]
    fn ssl_settings_come_out_of_key_values() {
        let s = split_ssl(
            r"host=db user = app password='a \'b\\c d' sslmode=verify-ca sslrootcert='/a b/ca.pem'",
        )
        .unwrap();
        assert_eq!(s.rest, r"host='db' user='app' password='a \'b\\c d'");
        assert_eq!(s.mode.as_deref(), Some("verify-ca"));
        assert_eq!(s.root.as_deref(), Some("/a b/ca.pem"));
        let config: Config = s.rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&br"a 'b\c d"[..]));
        assert!(split_ssl("host='db").is_err());
        assert!(split_ssl("host").is_err());
    }

    #[test]
    fn modes_parse_as_libpq_spells_them() {
        for (text, mode) in [
            ("disable", PgSslMode::Disable),
            ("allow", PgSslMode::Prefer),
            ("prefer", PgSslMode::Prefer),
            ("require", PgSslMode::Require),
            ("verify-ca", PgSslMode::VerifyCa),
            ("verify-full", PgSslMode::VerifyFull),
        ] {
            assert_eq!(PgSslMode::parse(text).unwrap(), mode);
        }
        assert!(matches!(
            PgSslMode::parse("verify_full"),
            Err(Error::InvalidConfig { .. })
        ));
    }

    #[test]
    fn application_name_defaults_unless_set() {
        let none = TlsSettings::default();
        let t = Target::new(&Source::Url("host=/tmp user=x".into()), &none).unwrap();
        assert_eq!(t.config.get_application_name(), Some(APPLICATION_NAME));
        let t = Target::new(
            &Source::Url("host=/tmp user=x application_name=billing".into()),
            &none,
        )
        .unwrap();
        assert_eq!(t.config.get_application_name(), Some("billing"));
        let mut own = Config::new();
        own.host("/tmp").application_name("orders");
        let t = Target::new(&Source::Config(Box::new(own)), &none).unwrap();
        assert_eq!(t.config.get_application_name(), Some("orders"));
    }

    #[test]
    fn tls_only_modes_never_become_clear_text() {
        let none = TlsSettings::default();
        let with_tls = cfg!(feature = "postgres-tls");
        for url in [
            "host=db sslmode=require",
            "postgres://db/x?sslmode=verify-full&sslrootcert=system",
            "host=db sslmode=verify-ca sslrootcert=system",
        ] {
            match Target::new(&Source::Url(url.into()), &none) {
                Ok(t) => {
                    assert!(with_tls, "{url}: built without TLS");
                    assert!(t.demands_tls());
                    assert_eq!(t.config.get_ssl_mode(), ClientSslMode::Require, "{url}");
                }
                Err(Error::Unsupported { .. }) => assert!(!with_tls, "{url}"),
                // No platform store on this host.
                Err(Error::InvalidConfig { reason }) => {
                    assert!(reason.contains("system"), "{url}: {reason}");
                }
                Err(e) => panic!("{url}: {e}"),
            }
        }
        // A mode set on the builder wins over the string's.
        let set = TlsSettings {
            mode: Some(PgSslMode::Require),
            root_cert: None,
        };
        match Target::new(&Source::Url("host=db sslmode=disable".into()), &set) {
            Ok(t) => assert_eq!(t.config.get_ssl_mode(), ClientSslMode::Require),
            Err(e) => assert!(matches!(e, Error::Unsupported { .. }), "{e}"),
        }
        // verify-* without a root certificate is refused, not unverified.
        if RootCert::default_file().is_none() && cfg!(feature = "postgres-tls") {
            let e = Target::new(&Source::Url("host=db sslmode=verify-full".into()), &none).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
        }
    }
}
