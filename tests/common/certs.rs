//! Test certificates: a certificate authority generated with rcgen that
//! signs server and client certificates, all PEM.
//!
//! Shared by `tests/it/tls.rs` and `examples/test_certs.rs` (the files the SDK
//! suites use against a TLS idemd), so both speak of the same certificates.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate authority that signs test certificates.
pub struct Ca {
    /// Signs leaf certificates.
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM: what clients and servers trust.
    pub pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// A leaf certificate and its key, PEM.
    pub fn leaf(&self, sans: Vec<SanType>, usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "leaf");
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf cert");
        (cert.pem(), key.serialize_pem())
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self) -> (String, String) {
        self.leaf(
            vec![
                SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
                SanType::DnsName("localhost".try_into().expect("dns")),
            ],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    pub fn client_uri(&self, uri: &str) -> (String, String) {
        self.leaf(
            vec![SanType::URI(uri.try_into().expect("uri"))],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    pub fn client_dns(&self, name: &str) -> (String, String) {
        self.leaf(
            vec![SanType::DnsName(name.try_into().expect("dns"))],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }
}
