//! The vault's TLS: one CA per sandbox, which its commands trust, and a
//! leaf for each host the proxy terminates, minted when first asked for.
//!
//! Boundary: certificates and rustls configurations, no sockets. Unlike the
//! broker's per-run CA (tls.rs beside the broker), this one cannot be
//! name-constrained: a vault's bindings change while the sandbox runs, and
//! may name `*.` hosts, after the sandbox already trusts its CA — as the
//! reference's mitmproxy CA is not constrained either. Its key is minted by
//! the frontend that installs the certificate in the sandbox (so a resumed
//! sandbox keeps trusting the same one), crosses only the Job's control
//! socket, and is never written down; `Debug` never shows it. The proxy only
//! terminates TLS for a host a binding names.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::KeyPair;
use rustls::ServerConfig;
use serde::{Deserialize, Serialize};

use crate::broker::tls::{ca_params, leaf_server, Upstream};
use crate::broker::BrokerError;

const CA_NAME: &str = "pvisor sandbox credential vault CA";
/// The leaves kept (then minted again as asked for).
const MAX_LEAVES: usize = 256;

/// A sandbox's vault CA: its certificate (for the sandbox to trust) and key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VaultCa {
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for VaultCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultCa").finish_non_exhaustive()
    }
}

impl VaultCa {
    pub fn mint() -> Result<Self, BrokerError> {
        let key = KeyPair::generate().map_err(BrokerError::Mint)?;
        let cert = ca_params(&[], CA_NAME).self_signed(&key).map_err(BrokerError::Mint)?;
        Ok(Self { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// The certificate (PEM) the sandbox trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }
}

/// What the proxy terminates vault-bound TLS with: the CA, its leaves by
/// host, and how destinations are verified.
pub(crate) struct VaultTls {
    ca: VaultCa,
    issuer: rcgen::Certificate,
    key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    upstream: Upstream,
}

impl std::fmt::Debug for VaultTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultTls").finish_non_exhaustive()
    }
}

impl VaultTls {
    /// Rebuilds the issuer from the CA's key: a certificate self-signed
    /// from the same parameters and key has the subject and key identifier
    /// the sandbox's copy has, so the leaves it signs chain to that copy.
    pub(crate) fn new(ca: &VaultCa) -> Result<Self, BrokerError> {
        let key = KeyPair::from_pem(&ca.key_pem).map_err(BrokerError::Mint)?;
        let issuer = ca_params(&[], CA_NAME).self_signed(&key).map_err(BrokerError::Mint)?;
        let upstream = Upstream::native()?;
        Ok(Self { ca: ca.clone(), issuer, key, leaves: Mutex::default(), upstream })
    }

    pub(crate) fn ca(&self) -> &VaultCa {
        &self.ca
    }

    /// The configuration that presents a leaf for `host` to the sandbox.
    pub(crate) fn server(&self, host: &str) -> Option<Arc<ServerConfig>> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = leaves.get(&host) {
            return Some(config.clone());
        }
        let config = leaf_server(&host, &self.issuer, &self.key).ok()?;
        // Bounded: a `*.` binding lets the sandbox name endless hosts.
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host, config.clone());
        Some(config)
    }

    pub(crate) fn upstream(&self) -> &Upstream {
        &self.upstream
    }
}
