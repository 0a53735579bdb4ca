//! The vault's rules, checked against the reference's own cases
//! (components/egress/pkg/credentialvault/vault_test.go and
//! mitmscripts/system.py's matching).

use super::active::Request;
use super::*;
use crate::policy::OrderedRule;

fn policy(rules: &[(RuleAction, &str)]) -> OrderedPolicy {
    let rules =
        rules.iter().map(|(action, target)| OrderedRule { action: *action, target: (*target).into() });
    OrderedPolicy { default_action: RuleAction::Allow, rules: rules.collect(), source: "test".into() }
}

fn allow(hosts: &[&str]) -> OrderedPolicy {
    policy(&hosts.iter().map(|h| (RuleAction::Allow, *h)).collect::<Vec<_>>())
}

fn create(body: serde_json::Value, policy: &OrderedPolicy) -> Result<Vault, VaultError> {
    Vault::create(serde_json::from_value(body).unwrap(), Some(policy))
}

fn patch(vault: &Vault, body: serde_json::Value, policy: &OrderedPolicy) -> Result<Vault, VaultError> {
    vault.patch(serde_json::from_value(body).unwrap(), Some(policy))
}

fn binding(name: &str, host: &str, path: &str, auth: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "name": name, "match": { "schemes": ["http"], "ports": [80], "hosts": [host],
        "methods": ["get"], "paths": [path] }, "auth": auth })
}

fn request<'a>(host: &'a str, path: &'a str) -> Request<'a> {
    Request { scheme: "http", host, port: 80, method: "GET", path }
}

#[test]
fn every_auth_type_renders_its_headers_and_the_state_holds_no_value() {
    let body = serde_json::json!({
        "credentials": [
            { "name": "b", "source": { "value": "bearer-value" } },
            { "name": "k", "source": { "type": "inline", "value": "key-value" } },
            { "name": "id", "source": { "value": "id-value" } },
        ],
        "bindings": [
            binding("bearer", "api.example.com", "/bearer", serde_json::json!({ "type": "bearer", "credential": "b" })),
            binding("basic", "api.example.com", "/basic", serde_json::json!({ "type": "basic", "credential": "b" })),
            binding("key", "api.example.com", "/key", serde_json::json!({ "type": "apiKey", "name": "x-API-key", "credential": "k" })),
            binding("custom", "api.example.com", "/custom*", serde_json::json!({ "type": "customHeaders",
                "headers": [{ "name": "x-client-id", "credential": "id" }, { "name": "X-Key", "credential": "k" }] })),
        ],
    });
    let vault = create(body, &allow(&["api.example.com"])).unwrap();
    let state = serde_json::to_string(&vault.state()).unwrap();
    for value in ["bearer-value", "key-value", "id-value"] {
        assert!(!state.contains(value) && !format!("{vault:?}").contains(value), "{state}");
    }
    // Sorted by name: basic, bearer, custom, key.
    assert_eq!(
        vault.state().bindings[3].auth,
        AuthMetadata { kind: "apiKey".into(), name: "X-Api-Key".into() }
    );
    assert_eq!(vault.state().bindings[3].matcher.methods, ["GET"], "methods are uppercased");
    let active = vault.active();
    let sent = |path: &str| {
        let Selection::Bound(b) = active.select(&request("API.example.com.", path)) else { panic!("{path}") };
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer placeholder".parse().unwrap());
        active.inject(b, &mut headers, &request("api.example.com", path));
        headers
    };
    assert_eq!(sent("/bearer")["authorization"], "Bearer bearer-value");
    assert_eq!(sent("/bearer").get_all("authorization").iter().count(), 1, "the sandbox's own is replaced");
    assert_eq!(sent("/basic")["authorization"], "Basic bearer-value");
    assert_eq!(sent("/key")["x-api-key"], "key-value");
    let custom = sent("/custom/x?q=1");
    assert_eq!(
        (custom["x-client-id"].to_str().unwrap(), custom["x-key"].to_str().unwrap()),
        ("id-value", "key-value")
    );
    assert!(matches!(active.select(&request("api.example.com", "/other")), Selection::None));
    assert!(matches!(active.select(&request("evil.example.com", "/bearer")), Selection::None));
    let https = Request { scheme: "https", port: 443, ..request("api.example.com", "/bearer") };
    assert!(matches!(active.select(&https), Selection::None), "an http binding never matches https");

    let mut response = HeaderMap::new();
    response.insert("x-echo", "Bearer bearer-value and key-value".parse().unwrap());
    active.redact(&mut response);
    assert_eq!(response["x-echo"], "[REDACTED] and [REDACTED]");
}

use hyper::header::HeaderMap;

#[test]
fn revisions_advance_and_a_refused_patch_changes_nothing() {
    let policy = allow(&["api.example.com"]);
    let vault = create(serde_json::json!({ "credentials": [], "bindings": [] }), &policy).unwrap();
    assert_eq!(vault.revision(), 1);
    let add = serde_json::json!({ "expectedRevision": 1,
        "credentials": { "add": [{ "name": "t", "source": { "value": "v1" } }] },
        "bindings": { "add": [binding("b", "api.example.com", "/x", serde_json::json!({ "type": "bearer", "credential": "t" }))] } });
    let two = patch(&vault, add, &policy).unwrap();
    assert_eq!((two.revision(), two.state().credentials[0].revision), (2, 2));
    let stale = serde_json::json!({ "expectedRevision": 1, "bindings": { "delete": ["b"] } });
    assert_eq!(
        patch(&two, stale, &policy).unwrap_err(),
        VaultError::RevisionMismatch { expected: 1, current: 2 }
    );
    assert!(VaultError::RevisionMismatch { expected: 1, current: 2 }.is_conflict());
    // Deleting a credential a binding still uses is refused.
    let orphan = serde_json::json!({ "credentials": { "delete": ["t"] } });
    assert!(matches!(patch(&two, orphan, &policy), Err(VaultError::UnknownCredential { .. })));
    // Replace bumps the credential's revision; null fields read as absent (the SDKs send them).
    let replace = serde_json::json!({ "expectedRevision": null, "bindings": null,
        "credentials": { "replace": [{ "name": "t", "source": { "value": "v2" } }], "add": null } });
    let three = patch(&two, replace, &policy).unwrap();
    assert_eq!((three.revision(), three.state().credentials[0].revision), (3, 3));
    for (body, err) in [
        (
            serde_json::json!({ "credentials": { "delete": ["t"], "add": [{ "name": "t", "source": { "value": "v" } }] } }),
            "multiple operations",
        ),
        (
            serde_json::json!({ "credentials": { "replace": [{ "name": "nope", "source": { "value": "v" } }] } }),
            "does not exist",
        ),
        (
            serde_json::json!({ "credentials": { "add": [{ "name": "t", "source": { "value": "v" } }] } }),
            "already exists",
        ),
        (
            serde_json::json!({ "credentials": { "add": [{ "name": "n", "source": { "value": "v" } }, { "name": "n", "source": { "value": "v" } }] } }),
            "duplicate",
        ),
        (serde_json::json!({ "bindings": { "delete": ["nope"] } }), "does not exist"),
        (
            serde_json::json!({ "credentials": { "add": [{ "name": "n", "source": { "value": "a\r\nb" } }] } }),
            "control character",
        ),
        (
            serde_json::json!({ "credentials": { "add": [{ "name": "n", "source": { "type": "vault", "value": "v" } }] } }),
            "source type",
        ),
    ] {
        let got = patch(&three, body.clone(), &policy).unwrap_err().to_string();
        assert!(got.contains(err), "{body}: {got}");
        assert!(!got.contains("a\r\nb"));
    }
    assert_eq!(three.revision(), 3);
}

#[test]
fn bindings_are_normalized_or_refused_with_the_reason() {
    let policy = allow(&["api.example.com", "*.example.org"]);
    let with = |matcher: serde_json::Value, auth: serde_json::Value| {
        let body = serde_json::json!({ "credentials": [{ "name": "c", "source": { "value": "v" } }],
            "bindings": [{ "name": "b", "match": matcher, "auth": auth }] });
        create(body, &policy)
    };
    let bearer = serde_json::json!({ "type": "bearer", "credential": "c" });
    let vault = with(serde_json::json!({ "hosts": ["API.Example.com.", "api.example.com"] }), bearer.clone())
        .unwrap();
    let m = &vault.state().bindings[0].matcher;
    assert_eq!(
        (m.schemes.clone(), m.ports.clone(), m.hosts.clone(), m.paths.clone(), m.methods.len()),
        (vec!["https".to_owned()], vec![443], vec!["api.example.com".to_owned()], vec!["/*".to_owned()], 5)
    );
    assert!(
        with(serde_json::json!({ "hosts": ["a.b.example.org"] }), bearer.clone()).is_ok(),
        "covered by *.example.org"
    );
    for (matcher, auth, says) in [
        (serde_json::json!({ "hosts": [] }), bearer.clone(), "hosts cannot be empty"),
        (serde_json::json!({ "hosts": ["10.0.0.1"] }), bearer.clone(), "not an IP address"),
        (serde_json::json!({ "hosts": ["localhost"] }), bearer.clone(), "FQDN"),
        (serde_json::json!({ "hosts": ["https://api.example.com"] }), bearer.clone(), "scheme or path"),
        (serde_json::json!({ "hosts": ["a*.example.com"] }), bearer.clone(), "FQDN"),
        (serde_json::json!({ "hosts": ["other.example.com"] }), bearer.clone(), "not covered"),
        (serde_json::json!({ "hosts": ["example.org"] }), bearer.clone(), "not covered"),
        (serde_json::json!({ "hosts": ["api.example.com"], "ports": [8443] }), bearer.clone(), "port 8443"),
        (serde_json::json!({ "hosts": ["api.example.com"], "ports": [0] }), bearer.clone(), "invalid port"),
        (serde_json::json!({ "hosts": ["api.example.com"], "schemes": ["ftp"] }), bearer.clone(), "scheme"),
        (serde_json::json!({ "hosts": ["api.example.com"], "paths": ["x"] }), bearer.clone(), "start with /"),
        (
            serde_json::json!({ "hosts": ["api.example.com"] }),
            serde_json::json!({ "type": "apiKey", "name": "Host", "credential": "c" }),
            "reserved",
        ),
        (
            serde_json::json!({ "hosts": ["api.example.com"] }),
            serde_json::json!({ "type": "apiKey", "name": "x y", "credential": "c" }),
            "invalid credential header",
        ),
        (
            serde_json::json!({ "hosts": ["api.example.com"] }),
            serde_json::json!({ "type": "oauth", "credential": "c" }),
            "unsupported auth",
        ),
        (
            serde_json::json!({ "hosts": ["api.example.com"] }),
            serde_json::json!({ "type": "bearer", "credential": "missing" }),
            "unknown credential",
        ),
        (
            serde_json::json!({ "hosts": ["api.example.com"] }),
            serde_json::json!({ "type": "customHeaders", "headers": [
            { "name": "X-A", "credential": "c" }, { "name": "x-a", "credential": "c" }] }),
            "duplicate custom header",
        ),
    ] {
        let got = with(matcher.clone(), auth).unwrap_err().to_string();
        assert!(got.contains(says), "{matcher}: {got}");
    }
    let body = serde_json::json!({ "credentials": [], "bindings": [{ "name": "b", "match": { "hosts": ["api.example.com"] }, "auth": bearer }] });
    assert_eq!(
        Vault::create(serde_json::from_value(body).unwrap(), None).unwrap_err(),
        VaultError::NoEgressRules
    );
    let unknown =
        serde_json::from_value::<CreateRequest>(serde_json::json!({ "credentials": [], "extra": 1 }));
    assert!(unknown.is_err(), "unknown fields are refused");
    // A deny rule before the allow rule wins: the host is not covered.
    let denied = policy_with_deny();
    let body = serde_json::json!({ "credentials": [{ "name": "c", "source": { "value": "v" } }],
        "bindings": [{ "name": "b", "match": { "hosts": ["api.example.com"] }, "auth": { "type": "bearer", "credential": "c" } }] });
    assert!(matches!(create(body, &denied), Err(VaultError::NotCovered { .. })));
}

fn policy_with_deny() -> OrderedPolicy {
    policy(&[(RuleAction::Deny, "*.example.com"), (RuleAction::Allow, "api.example.com")])
}

#[test]
fn overlapping_bindings_are_refused_and_precedence_picks_exact_hosts() {
    let policy = allow(&["*.example.com"]);
    let bearer = serde_json::json!({ "type": "bearer", "credential": "c" });
    let two = |a: serde_json::Value, b: serde_json::Value| {
        create(
            serde_json::json!({ "credentials": [{ "name": "c", "source": { "value": "v" } }],
                "bindings": [{ "name": "a", "match": a, "auth": bearer }, { "name": "b", "match": b, "auth": bearer }] }),
            &policy,
        )
    };
    let ambiguous = [
        (
            serde_json::json!({ "hosts": ["x.example.com"] }),
            serde_json::json!({ "hosts": ["x.example.com"] }),
        ),
        (
            serde_json::json!({ "hosts": ["*.example.com"] }),
            serde_json::json!({ "hosts": ["*.a.example.com"] }),
        ),
        (
            serde_json::json!({ "hosts": ["x.example.com"], "paths": ["/v1/*"] }),
            serde_json::json!({ "hosts": ["x.example.com"], "paths": ["/v1/models"] }),
        ),
    ];
    for (a, b) in ambiguous {
        assert!(matches!(two(a.clone(), b.clone()), Err(VaultError::Ambiguous(..))), "{a} {b}");
    }
    let distinct = [
        (
            serde_json::json!({ "hosts": ["x.example.com"] }),
            serde_json::json!({ "hosts": ["*.example.com"] }),
        ),
        (
            serde_json::json!({ "hosts": ["x.example.com"], "paths": ["/a*"] }),
            serde_json::json!({ "hosts": ["x.example.com"], "paths": ["/b*"] }),
        ),
        (
            serde_json::json!({ "hosts": ["x.example.com"], "methods": ["GET"] }),
            serde_json::json!({ "hosts": ["x.example.com"], "methods": ["POST"] }),
        ),
    ];
    for (a, b) in distinct {
        assert!(two(a.clone(), b.clone()).is_ok(), "{a} {b}");
    }
    // Exact beats wildcard at request time; the apex is not a subdomain.
    let vault = two(
        serde_json::json!({ "hosts": ["x.example.com"] }),
        serde_json::json!({ "hosts": ["*.example.com"] }),
    )
    .unwrap()
    .active();
    let https = |host| Request { scheme: "https", host, port: 443, method: "POST", path: "/" };
    assert!(matches!(vault.select(&https("x.example.com")), Selection::Bound(b) if b.name() == "a"));
    assert!(matches!(vault.select(&https("y.example.com")), Selection::Bound(b) if b.name() == "b"));
    assert!(matches!(vault.select(&https("example.com")), Selection::None));
    assert!(matches!(vault.select(&https("xexample.com")), Selection::None));
    assert!(
        vault.intercepts("https", "y.example.com", 443) && !vault.intercepts("https", "y.example.com", 80)
    );
    assert!(!vault.intercepts("http", "y.example.com", 443));
}

#[test]
fn a_path_an_upstream_may_resolve_elsewhere_matches_only_the_whole_host() {
    let policy = allow(&["api.example.com"]);
    let bearer = serde_json::json!({ "type": "bearer", "credential": "c" });
    let body = serde_json::json!({ "credentials": [{ "name": "c", "source": { "value": " padded-value " } }],
        "bindings": [binding("repo", "api.example.com", "/repos/mine/*", bearer)] });
    let vault = create(body, &policy).unwrap().active();
    assert!(matches!(vault.select(&request("api.example.com", "/repos/mine/x?y=1")), Selection::Bound(_)));
    for escape in [
        "/repos/mine/../theirs/keys",
        "/repos/mine/%2e%2e/theirs",
        "/repos/mine/..%2Ftheirs",
        "/repos/mine/x;/../../admin",
        "/repos/mine/..\\theirs",
        "/repos/mine/./x",
    ] {
        assert!(matches!(vault.select(&request("api.example.com", escape)), Selection::None), "{escape}");
    }
    // A value echoed without its spaces, or beside a non-ASCII byte, is redacted too.
    let mut response = HeaderMap::new();
    response.insert("x-echo", hyper::header::HeaderValue::from_bytes(b"k=padded-value \xff").unwrap());
    vault.redact(&mut response);
    assert_eq!(response["x-echo"].as_bytes(), b"k=[REDACTED] \xff");
}
