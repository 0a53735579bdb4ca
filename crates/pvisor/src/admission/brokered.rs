//! Brokered secrets (`--secret VAR@HOST[:PORT]`): the command gets a
//! placeholder in `VAR`, and the run's proxy puts the value into the
//! headers of requests to `HOST` alone.
//!
//! Boundary: admission's part only. [`bind`] reads each value from the
//! request's environment (the frontend's own) and refuses what cannot be
//! brokered, before anything is recorded; [`check_allowed`] requires the
//! destination to be allowed by the network policy already (a `--secret`
//! never opens the network by itself); [`start`] mints the per-run CA
//! and writes the CA bundle the sandbox trusts. The values stay in this
//! process's memory, in the [`Broker`] the Session hands to the proxy:
//! the records name each variable and destination, never a value.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pvisor_core::records::NetworkMode;
use pvisor_net::broker::{Binding, BindingSpec, Broker};
use pvisor_net::{Decide, EffectiveNetwork};

use super::AdmissionError;

/// The variables that point TLS clients at a CA bundle, all set to the
/// run's bundle: OpenSSL (and Python's `ssl`, Go, Ruby), curl, Python
/// `requests` and `httplib2`, Node (which adds it to its own roots), git,
/// pip, cargo, the AWS and Google CLIs, gRPC, Deno and Nix. A host that
/// set any of them to its own bundle would otherwise leave a client
/// without the run's CA.
pub const CA_VARIABLES: [&str; 13] = [
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "CARGO_HTTP_CAINFO",
    "AWS_CA_BUNDLE",
    "HTTPLIB2_CA_CERTS",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE",
    "DENO_CERT",
    "NIX_SSL_CERT_FILE",
];

/// Where a host keeps its bundle of trusted roots, first match wins.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// A run's broker and the CA bundle file the sandbox reads (removed with
/// its directory when the run's Session drops this).
#[derive(Debug)]
pub struct Brokered {
    pub broker: Arc<Broker>,
    /// The host's roots and the run's CA, shown read-only in the sandbox
    /// at this same path.
    pub bundle: PathBuf,
    _dir: tempfile::TempDir,
}

fn refuse(spec: &BindingSpec, problem: String) -> AdmissionError {
    AdmissionError::Secret { spec: spec.to_string(), problem }
}

/// Reads the value of each `--secret` from `env` and binds it to a fresh
/// placeholder (one per variable: a variable bound to several hosts keeps
/// it; a binding given twice counts once). Refuses an executor whose
/// sandbox cannot be given the run's CA, and an unset or empty variable.
pub(super) fn bind(
    specs: &[BindingSpec],
    env: &[(String, String)],
    executor: super::Backend<'_>,
) -> Result<Vec<Binding>, AdmissionError> {
    let mut bindings: Vec<Binding> = Vec::new();
    for spec in specs {
        if !executor.traits.shares_host_kernel {
            return Err(refuse(
                spec,
                format!("the {executor} executor cannot be given the run's CA; brokered secrets need --executor ns"),
            ));
        }
        if bindings.iter().any(|b| b.spec == *spec) {
            continue;
        }
        if let Some(earlier) = bindings.iter().find(|b| b.spec.variable == spec.variable) {
            let also = earlier.also_to(spec.clone());
            bindings.push(also);
            continue;
        }
        let value = env.iter().find(|(k, _)| *k == spec.variable).map(|(_, v)| v.clone()).unwrap_or_default();
        if value.is_empty() {
            return Err(refuse(
                spec,
                format!("{} is not set in pvisor's environment; export it first (its value is what the proxy sends)", spec.variable),
            ));
        }
        let binding = Binding::new(spec.clone(), value).map_err(|e| refuse(spec, e.to_string()))?;
        bindings.push(binding);
    }
    Ok(bindings)
}

/// Each binding's destination must already be allowed through the proxy
/// (on its port, else on 443): the safer reading of `--secret`, which then
/// grants nothing the policy line does not show.
pub(super) fn check_allowed(bindings: &[Binding], network: &EffectiveNetwork) -> Result<(), AdmissionError> {
    for binding in bindings {
        let spec = &binding.spec;
        if network.mode != NetworkMode::Proxy {
            return Err(refuse(
                spec,
                format!(
                    "the network mode is {}, where no request passes pvisor's proxy, which brokering needs: give --allow {} (and no --net host)",
                    network.mode.as_str(),
                    destination(spec)
                ),
            ));
        }
        let port = spec.port.unwrap_or(443);
        if let pvisor_net::policy::Decision::Deny { rule, .. } = network.decide(&spec.host, port) {
            return Err(refuse(
                spec,
                format!(
                    "{}:{port} is not allowed by the network policy ({rule}); a --secret opens nothing by itself: add --allow {}",
                    spec.host,
                    destination(spec)
                ),
            ));
        }
    }
    Ok(())
}

/// The `--allow` rule that opens a binding's destination: what follows
/// the `@` of its `VAR@HOST[:PORT]`.
fn destination(spec: &BindingSpec) -> String {
    let shown = spec.to_string();
    shown.split_once('@').map_or(shown.clone(), |(_, destination)| destination.to_owned())
}

/// Mints the run's CA and writes the bundle the sandbox trusts: the roots
/// the command would have trusted (its `SSL_CERT_FILE`, else the
/// system's), then the run's CA, so every other host still verifies.
pub(super) fn start(
    bindings: Vec<Binding>,
    env: &[(String, String)],
) -> Result<Option<Brokered>, AdmissionError> {
    if bindings.is_empty() {
        return Ok(None);
    }
    let broker = Broker::new(bindings)?;
    let roots = env
        .iter()
        .find(|(k, _)| k == "SSL_CERT_FILE")
        .map(|(_, v)| PathBuf::from(v))
        .into_iter()
        .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from))
        .find_map(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let io = |source| AdmissionError::CaBundle { source };
    let dir = tempfile::Builder::new().prefix("pvisor-broker-").tempdir().map_err(io)?;
    let bundle = dir.path().join("ca-bundle.pem");
    // Public certificates for this run's sandbox, in a fresh directory of
    // an unpredictable name, gone with the run: not a record.
    #[allow(clippy::disallowed_methods)]
    std::fs::write(&bundle, format!("{roots}\n{}", broker.ca_pem())).map_err(io)?;
    // Public certificates: whoever the command runs as reads them.
    set_mode(dir.path(), 0o755).map_err(io)?;
    set_mode(&bundle, 0o644).map_err(io)?;
    Ok(Some(Brokered { broker: Arc::new(broker), bundle, _dir: dir }))
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The command's environment with each bound variable holding its
/// placeholder, the CA variables naming the bundle, and no other variable
/// holding a bound value (a copy under another name would leak it).
/// Returns the names removed for that.
pub(super) fn rewrite_env(
    env: Vec<(String, String)>,
    brokered: &Brokered,
) -> (Vec<(String, String)>, Vec<String>) {
    let bindings = brokered.broker.bindings();
    let bound = |k: &str| bindings.iter().any(|b| b.spec.variable == k) || CA_VARIABLES.contains(&k);
    let (mut kept, mut removed) = (Vec::new(), Vec::new());
    for (k, v) in env {
        if bound(&k) {
            continue;
        }
        if bindings.iter().any(|b| v.contains(b.value())) {
            removed.push(k);
        } else {
            kept.push((k, v));
        }
    }
    for b in bindings {
        if !kept.iter().any(|(k, _)| *k == b.spec.variable) {
            kept.push((b.spec.variable.clone(), b.placeholder.clone()));
        }
    }
    let bundle = brokered.bundle.to_string_lossy().into_owned();
    kept.extend(CA_VARIABLES.iter().map(|k| ((*k).to_owned(), bundle.clone())));
    (kept, removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> super::super::Backend<'static> {
        super::super::Backend {
            name: "ns",
            traits: crate::backends::BackendTraits { shares_host_kernel: true, ..Default::default() },
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn an_unset_variable_or_a_vm_is_refused_by_name_and_never_by_value() {
        let spec: BindingSpec = "KEY@api.example.com".parse().unwrap();
        let err = bind(std::slice::from_ref(&spec), &env(&[("OTHER", "x")]), ns()).unwrap_err().to_string();
        assert!(err.contains("KEY is not set") && err.contains("KEY@api.example.com"), "{err}");
        let vm = super::super::Backend {
            name: "vm",
            traits: crate::backends::BackendTraits { guest_machine: true, ..Default::default() },
        };
        let err = bind(std::slice::from_ref(&spec), &env(&[("KEY", "real")]), vm).unwrap_err().to_string();
        assert!(err.contains("--executor ns") && !err.contains("real"), "{err}");
        let twice = [spec.clone(), spec.clone(), "KEY@other.example.com".parse().unwrap()];
        let bound = bind(&twice, &env(&[("KEY", "real")]), ns()).unwrap();
        assert_eq!(bound.len(), 2, "a repeated binding counts once");
        assert_eq!(bound[0].placeholder, bound[1].placeholder, "one variable, one placeholder");
    }

    #[test]
    fn the_destination_must_be_allowed_already() {
        use pvisor_net::policy::{resolve, PolicySpec, Scope, ScopedPolicy};
        let policy = |allow: &[&str]| {
            let spec = PolicySpec {
                mode: None,
                allow: allow.iter().map(|s| (*s).to_owned()).collect(),
                deny: vec![],
                ordered: None,
            };
            resolve(&[ScopedPolicy { scope: Scope::CommandLine, source: "command line".into(), spec }])
                .unwrap()
        };
        let bindings =
            bind(&["KEY@127.0.0.1:8080".parse().unwrap()], &env(&[("KEY", "real")]), ns()).unwrap();
        assert!(check_allowed(&bindings, &policy(&["127.0.0.1:8080"])).is_ok());
        let err = check_allowed(&bindings, &policy(&["127.0.0.1:9090"])).unwrap_err().to_string();
        assert!(err.contains("--allow 127.0.0.1:8080"), "{err}");
        let err = check_allowed(&bindings, &policy(&[])).unwrap_err().to_string();
        assert!(err.contains("network mode is none"), "{err}");
    }

    #[test]
    fn the_sandbox_gets_the_placeholder_the_bundle_and_no_copy_of_the_value() {
        let host = env(&[
            ("KEY", "real-value"),
            ("COPY", "x real-value y"),
            ("PATH", "/bin"),
            ("SSL_CERT_FILE", "/nope"),
        ]);
        let bindings = bind(&["KEY@api.example.com".parse().unwrap()], &host, ns()).unwrap();
        let placeholder = bindings[0].placeholder.clone();
        let brokered = start(bindings, &host).unwrap().unwrap();
        let bundle = std::fs::read_to_string(&brokered.bundle).unwrap();
        assert!(bundle.contains(brokered.broker.ca_pem()));
        let (sandbox, removed) = rewrite_env(host, &brokered);
        assert_eq!(removed, ["COPY"]);
        assert!(sandbox.contains(&("KEY".to_owned(), placeholder)));
        assert!(sandbox.iter().all(|(_, v)| !v.contains("real-value")));
        let bundle_path = brokered.bundle.to_string_lossy().into_owned();
        for name in CA_VARIABLES {
            assert!(sandbox.contains(&(name.to_owned(), bundle_path.clone())), "{name}");
        }
    }
}
