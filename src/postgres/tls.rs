//! TLS to the server on rustls (feature `postgres-tls`): the checks of
//! each `sslmode`, as libpq makes them.
//!
//! rustls verifies a certificate's chain *and* its host name, or nothing
//! if told to: libpq's `verify-ca` (the chain, not the name) and its
//! `require` (encryption; the chain only if a root certificate is given)
//! are the two verifiers here. Neither skips the handshake's own
//! signature checks, so the server still proves it holds the key of the
//! certificate it sent (which channel binding, `SCRAM-SHA-256-PLUS`, then
//! ties the password exchange to).

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::target::{RootCert, SslMode};
use crate::error::{Error, Result};

/// The connector for `mode` (anything but `disable`), trusting `root`.
pub(super) fn connector(mode: SslMode, root: Option<&RootCert>) -> Result<MakeRustlsConnect> {
    // rustls 0.23.48 deprecates ring's provider for its lack of
    // post-quantum key exchange (X25519MLKEM768); its classical one
    // (X25519, ECDHE) is what PostgreSQL's own OpenSSL builds negotiate
    // today. aws-lc-rs has it, at the price of CMake (and NASM for
    // Windows) to build: see Cargo.toml.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("cannot set up TLS: {e}")))?;
    let roots = root.map(load).transpose()?;
    let config = match roots {
        Some(roots) => {
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                .build()
                .map_err(|e| invalid(format!("cannot use the PostgreSQL root certificates: {e}")))?;
            if mode == SslMode::VerifyFull {
                builder.with_webpki_verifier(webpki)
            } else {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
            }
        }
        // `verify-ca` and `verify-full` never come here (a root
        // certificate is required for them): see `Target::new`.
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider))),
    };
    Ok(MakeRustlsConnect::new(config.with_no_client_auth()))
}

fn invalid(reason: String) -> Error {
    Error::InvalidConfig { reason }
}

/// The certificates of `root`: a PEM file, or the platform's store.
fn load(root: &RootCert) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match root {
        RootCert::File(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| unreadable(path, &e.to_string()))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(unreadable(path, "no certificate in it"));
            }
        }
        RootCert::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(invalid(format!(
                    "sslrootcert=system: no root certificate found in the platform's store{}",
                    found
                        .errors
                        .first()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                )));
            }
        }
    }
    Ok(store)
}

fn unreadable(path: &Path, why: &str) -> Error {
    invalid(format!(
        "cannot read the PostgreSQL root certificate {}: {why}",
        path.display()
    ))
}

/// `verify-ca` (and `require` or `prefer` given a root certificate): the
/// chain must lead to a trusted root, whatever names the certificate is
/// for. rustls checks the name only once the chain is good, so a name
/// error means a good chain.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` (and `prefer`) without a root certificate, as libpq: the
/// connection is encrypted, the certificate not checked. The handshake's
/// signatures still are.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
