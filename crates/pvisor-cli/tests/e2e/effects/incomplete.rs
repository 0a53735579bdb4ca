//! A stage the executor could not take out of the sandbox whole: its Bundle
//! marks it incomplete, review says so first, and apply refuses it unless
//! told `--allow-incomplete`.

use std::fs;

use crate::support::*;

/// Hard links past the `--disk` quota make the copy-out stop short (the
/// same cut a `vm` export that fails half-way makes).
#[test]
fn an_incomplete_stage_is_marked_and_never_applied_as_if_whole() {
    for who in [As::Rootless, As::Root] {
        let env = Env::new(who);
        let out = env.pvisor(&[
            "run",
            "-q",
            "--disk",
            "8M",
            "--",
            "sh",
            "-c",
            "echo marker > probe; head -c 4000000 /dev/urandom > big && for i in $(seq 40); do ln big link$i; done; exit 0",
        ]);
        assert!(out.status.success(), "{who:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("the stage is incomplete"), "{who:?}: {}", text(&out.stderr));
        let bundle: serde_json::Value = {
            let runs: Vec<_> = fs::read_dir(env.home.join("runs")).unwrap().flatten().collect();
            let path = runs[0].path().join("attempts/1/bundle.json");
            serde_json::from_slice(&fs::read(&path).unwrap()).unwrap()
        };
        assert!(bundle["incomplete"].as_str().is_some_and(|s| !s.is_empty()), "{who:?}: {bundle}");
        let review = env.expect(&["review"], 0);
        assert!(review.contains("INCOMPLETE stage"), "{who:?}: {review}");
        let refused = env.pvisor(&["apply", "--all"]);
        assert_eq!(refused.status.code(), Some(125), "{who:?}: {}", text(&refused.stderr));
        assert!(text(&refused.stderr).contains("--allow-incomplete"), "{who:?}: {}", text(&refused.stderr));
        assert!(!env.ws.join("probe").exists(), "{who:?}: an incomplete stage was applied");
        env.expect(&["apply", "--all", "--allow-incomplete"], 0);
        assert_eq!(fs::read_to_string(env.ws.join("probe")).unwrap(), "marker\n", "{who:?}");
    }
}
