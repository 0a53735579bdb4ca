//! Gated keys of a JSON state file (`~/.claude.json`): the file carries
//! from run to run, but the values at these keys (MCP servers, hooks,
//! permissions, allowed tools) only as approved.
//!
//! A key pattern is dot-separated object keys, `*` standing for any one
//! key (`projects.*.mcpServers`). Matching works on parsed documents only;
//! a file that is not a JSON object is gated whole by the caller.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// A concrete key path, one object key per element (a key may hold dots:
/// project paths do).
type KeyPath = Vec<String>;

/// The values at every key `patterns` match in `doc`.
fn gated_values(doc: &Value, patterns: &[String]) -> BTreeMap<KeyPath, Value> {
    let mut out = BTreeMap::new();
    for pattern in patterns {
        let parts: Vec<&str> = pattern.split('.').collect();
        collect(doc, &parts, &mut Vec::new(), &mut out);
    }
    out
}

fn collect(node: &Value, parts: &[&str], at: &mut KeyPath, out: &mut BTreeMap<KeyPath, Value>) {
    let Some((first, rest)) = parts.split_first() else {
        out.insert(at.clone(), node.clone());
        return;
    };
    let Some(object) = node.as_object() else { return };
    for (key, value) in object.iter().filter(|(k, _)| *first == "*" || k.as_str() == *first) {
        at.push(key.clone());
        collect(value, rest, at, out);
        at.pop();
    }
}

/// Whether `a` and `b` differ at any gated key.
pub(crate) fn differ(a: &Value, b: &Value, patterns: &[String]) -> bool {
    gated_values(a, patterns) != gated_values(b, patterns)
}

/// `candidate` with every gated key as `approved` has it: its value, or
/// removed where `approved` has none.
pub(crate) fn reset(mut candidate: Value, approved: &Value, patterns: &[String]) -> Value {
    let wanted = gated_values(approved, patterns);
    for path in gated_values(&candidate, patterns).into_keys() {
        if !wanted.contains_key(&path) {
            remove(&mut candidate, &path);
        }
    }
    for (path, value) in wanted {
        set(&mut candidate, &path, value);
    }
    candidate
}

fn remove(doc: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut node = doc;
    for key in parents {
        match node.get_mut(key.as_str()) {
            Some(next) => node = next,
            None => return,
        }
    }
    if let Some(object) = node.as_object_mut() {
        object.remove(last);
    }
}

fn set(doc: &mut Value, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut node = doc;
    for key in parents {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        node = node
            .as_object_mut()
            .map(|o| o.entry(key.clone()).or_insert_with(|| Value::Object(Map::new())))
            .unwrap_or_else(|| unreachable!("made an object above"));
    }
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    if let Some(object) = node.as_object_mut() {
        object.insert(last.clone(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys() -> Vec<String> {
        super::super::DEFAULT_GATED_KEYS.iter().map(|k| (*k).to_owned()).collect()
    }

    #[test]
    fn counters_carry_and_mcp_servers_and_hooks_are_reset() {
        let approved = json!({"numStartups": 1, "projects": {"/p/a.b": {"allowedTools": []}}});
        let candidate = json!({
            "numStartups": 2,
            "mcpServers": {"evil": {"command": "sh"}},
            "projects": {"/p/a.b": {"allowedTools": ["Bash(*)"], "lastSessionId": "s2"}},
        });
        assert!(differ(&candidate, &approved, &keys()));
        let merged = reset(candidate, &approved, &keys());
        assert_eq!(
            merged,
            json!({"numStartups": 2, "projects": {"/p/a.b": {"allowedTools": [], "lastSessionId": "s2"}}})
        );
        assert!(!differ(&merged, &approved, &keys()));
    }
}
