//! The broker's TLS: a per-run certificate authority, a leaf certificate
//! per bound host, and the verification of the real hosts.
//!
//! Boundary: certificates and rustls configurations only, no sockets. The
//! CA's private key is generated here, signs the leaves, and is dropped:
//! only its certificate (public) leaves this module, for the sandbox to
//! trust. The CA is name-constrained to the bound hosts, so even a client
//! that trusts it accepts it for no other name. Upstream, the bound hosts
//! are verified against the host's own trust store (as OpenSSL finds it,
//! honouring `SSL_CERT_FILE` and `SSL_CERT_DIR`), never against this CA.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType, GeneralSubtree, IsCa,
    KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::BrokerError;

/// The only application protocol spoken on either side of a bound
/// connection: the relay is an HTTP/1.1 one.
const ALPN: &[u8] = b"http/1.1";

/// The per-run CA's certificate, the server configuration for each bound
/// host, and the client configuration for reaching them.
pub struct Authority {
    ca_pem: String,
    servers: HashMap<String, Arc<ServerConfig>>,
    upstream: Upstream,
}

/// How the proxy reaches a TLS destination it terminated for: verified
/// with the host's trusted roots (or a test's own).
#[derive(Clone)]
pub(crate) struct Upstream {
    client: Arc<ClientConfig>,
    /// Whether the host had no trusted roots: a bound plain-HTTP host
    /// still works, a bound HTTPS one is refused with this said.
    no_roots: bool,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").field("no_roots", &self.no_roots).finish_non_exhaustive()
    }
}

impl Upstream {
    /// Verifies with the host's trusted roots (as OpenSSL finds them).
    pub(crate) fn native() -> Result<Self, BrokerError> {
        let loaded = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(loaded.certs);
        Self::with_roots(roots)
    }

    pub(crate) fn with_roots(roots: RootCertStore) -> Result<Self, BrokerError> {
        let no_roots = roots.is_empty();
        let tls = |source| BrokerError::Tls { host: "the bound hosts".into(), source };
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![ALPN.to_vec()];
        Ok(Self { client: Arc::new(client), no_roots })
    }

    /// Why verifying a destination may fail before it starts: the host has
    /// no trusted roots at all.
    pub(crate) fn missing_roots(&self) -> Option<&'static str> {
        self.no_roots.then_some(
            "this host has no trusted root certificates: install ca-certificates or set SSL_CERT_FILE",
        )
    }

    /// The configuration that verifies a destination with the host's roots.
    pub(crate) fn client(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }
}

/// A leaf for `host`, signed by `ca`, and the configuration that presents
/// it (with the CA) to the sandbox.
pub(crate) fn leaf_server(
    host: &str,
    ca: &rcgen::Certificate,
    ca_key: &KeyPair,
) -> Result<Arc<ServerConfig>, BrokerError> {
    let leaf_key = KeyPair::generate().map_err(BrokerError::Mint)?;
    let mut params = CertificateParams::new(vec![host.to_owned()]).map_err(BrokerError::Mint)?;
    params.distinguished_name = name(host);
    let leaf = params.signed_by(&leaf_key, ca, ca_key).map_err(BrokerError::Mint)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let tls = |source| BrokerError::Tls { host: host.to_owned(), source };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls)?
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
        .map_err(tls)?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Arc::new(config))
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").field("hosts", &self.servers.keys().collect::<Vec<_>>()).finish()
    }
}

/// ring: it builds with a C compiler alone (aws-lc-rs wants more of the
/// toolchain). Its provider lacks the post-quantum key exchange, for
/// which rustls marks it deprecated; the classical suites it offers are
/// the ones rustls has always defaulted to.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Authority {
    /// Mints the CA and a leaf for each of `hosts`, and loads the host's
    /// trusted roots (none is not an error: a loopback model server over
    /// plain HTTP needs none).
    pub(super) fn new(hosts: &[&str]) -> Result<Self, BrokerError> {
        Self::with_upstream(hosts, Upstream::native()?)
    }

    #[cfg(test)]
    fn with_roots(hosts: &[&str], roots: RootCertStore) -> Result<Self, BrokerError> {
        Self::with_upstream(hosts, Upstream::with_roots(roots)?)
    }

    fn with_upstream(hosts: &[&str], upstream: Upstream) -> Result<Self, BrokerError> {
        let ca_key = KeyPair::generate().map_err(BrokerError::Mint)?;
        let ca =
            ca_params(hosts, "pvisor per-run broker CA").self_signed(&ca_key).map_err(BrokerError::Mint)?;
        let mut servers = HashMap::new();
        for host in hosts {
            servers.insert((*host).to_owned(), leaf_server(host, &ca, &ca_key)?);
        }
        Ok(Self { ca_pem: ca.pem(), servers, upstream })
    }

    /// An authority for unit tests that never verify an upstream.
    #[cfg(test)]
    pub(super) fn for_tests() -> Self {
        Self::with_roots(&[], RootCertStore::empty()).expect("a CA can be minted")
    }

    /// An authority that verifies upstreams against `roots` alone (tests
    /// of the relay, whose upstream has its own self-signed certificate).
    #[cfg(test)]
    pub(crate) fn for_tests_with_roots(hosts: &[&str], roots: &[CertificateDer<'static>]) -> Self {
        let mut store = RootCertStore::empty();
        store.add_parsable_certificates(roots.iter().cloned());
        Self::with_roots(hosts, store).expect("a CA can be minted")
    }

    pub(super) fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The configuration that presents `host`'s leaf to the sandbox.
    pub(crate) fn server(&self, host: &str) -> Option<Arc<ServerConfig>> {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        self.servers.get(&host).cloned()
    }

    /// How the bound hosts are reached.
    pub(crate) fn upstream(&self) -> &Upstream {
        &self.upstream
    }
}

/// A CA for `hosts` alone (every name, with none): it signs certificates
/// and nothing else, and its name constraints permit only the bound names
/// and addresses.
pub(crate) fn ca_params(hosts: &[&str], common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let permitted = hosts
        .iter()
        .map(|host| match host.parse::<IpAddr>() {
            Ok(ip) => GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
                ip,
                if ip.is_ipv4() { 32 } else { 128 },
            )),
            Err(_) => GeneralSubtree::DnsName((*host).to_owned()),
        })
        .collect::<Vec<_>>();
    // An empty constraint would permit every name: only constrain to something.
    if !hosts.is_empty() {
        params.name_constraints =
            Some(NameConstraints { permitted_subtrees: permitted, excluded_subtrees: vec![] });
    }
    params
}

fn name(common: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common);
    dn
}

/// The certificates of a PEM bundle (for tests and for callers that hold
/// their own roots).
pub fn certificates_from_pem(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).collect()
}
