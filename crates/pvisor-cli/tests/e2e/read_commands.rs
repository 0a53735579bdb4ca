//! `status`, `jobs` and `events`: lookup, JSON output, and honest states.

use crate::support::*;

#[test]
fn jobs_are_found_by_id_prefix_or_recency() {
    let env = Env::new(As::Rootless);
    assert_eq!(env.run_sh("exit 0").status.code(), Some(0));
    assert_eq!(env.run_sh("exit 4").status.code(), Some(4));
    let latest = env.status_json(None);
    assert_eq!(latest["exit_code"], 4);
    let job = latest["job"].as_str().unwrap();
    let bare = &job["job-".len()..];
    let by_prefix = env.status_json(Some(&bare[..20].to_ascii_lowercase()));
    assert_eq!(by_prefix["job"], job);
    assert_eq!(env.status_json(Some(job))["job"], job);

    let out = env.pvisor(&["jobs", "--json"]);
    assert!(out.status.success());
    let lines = json_lines(&text(&out.stdout));
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].0, "job");
    assert_eq!(lines[0].1["state"], "completed");
    assert_eq!(lines[1].1["job"], job);

    let human = text(&env.pvisor(&["jobs"]).stdout);
    assert!(human.contains("failed (exit 4)"), "{human}");
    let status = text(&env.pvisor(&["status"]).stdout);
    assert!(status.contains("receipt    valid"), "{status}");
}

#[test]
fn an_unknown_job_is_a_clear_error() {
    let env = Env::new(As::Rootless);
    let out = env.pvisor(&["status", "job-01ZZZZZZZZZZZZZZZZZZZZZZZZ"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("No job matches"), "{}", text(&out.stderr));
    let out = env.pvisor(&["status"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("no jobs yet"), "{}", text(&out.stderr));
}

#[test]
fn a_corrupt_receipt_is_an_error_naming_the_file_not_a_result() {
    let env = Env::new(As::Rootless);
    assert_eq!(env.run_sh("exit 0").status.code(), Some(0));
    let status = env.status_json(None);
    let receipt = env.attempt_dir(&status).join("completion.json");
    std::fs::write(&receipt, b"{\"format\": 1, \"job\": ").unwrap();
    let out = env.pvisor(&["status"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("completion.json is corrupt"), "{}", text(&out.stderr));
    // The listing succeeds (a damaged Job must not make `pvisor jobs` fail
    // forever) but never passes it silently.
    let jobs = env.pvisor(&["jobs"]);
    assert_eq!(jobs.status.code(), Some(0));
    assert!(text(&jobs.stdout).contains("damaged"), "{}", text(&jobs.stdout));
    assert!(text(&jobs.stderr).contains("damaged records"), "{}", text(&jobs.stderr));
}

#[test]
fn a_tampered_bundle_fails_verification() {
    let env = Env::new(As::Rootless);
    assert_eq!(env.run_sh("echo hi > f").status.code(), Some(0));
    let status = env.status_json(None);
    let bundle = env.attempt_dir(&status).join("bundle.json");
    let edited = std::fs::read_to_string(&bundle).unwrap().replace("\"added\"", "\"deleted\"");
    std::fs::write(&bundle, edited).unwrap();
    let out = env.pvisor(&["status"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("does not match its receipt"), "{}", text(&out.stderr));
}

#[test]
fn doctor_reports_every_check_and_probes_a_real_sandbox() {
    let env = Env::new(As::Rootless);
    let out = env.expect(&["doctor", "--json"], 0);
    let checks = records_of(&out, "check");
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    for want in
        ["user namespaces", "network namespace", "state directory", "cgroups", "seccomp", "KVM", "QEMU"]
    {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let sandbox = checks.iter().find(|c| c["name"].as_str().unwrap().starts_with("sandbox")).unwrap();
    assert_eq!(sandbox["status"], "ok", "{sandbox}");
    let human = env.expect(&["doctor"], 0);
    assert!(human.contains("pvisor run works on this host"), "{human}");
}

#[test]
fn doctor_names_a_missing_feature_and_its_fix() {
    let env = Env::new(As::Rootless);
    let inner = format!("echo 0 > /proc/sys/user/max_user_namespaces && exec {} doctor", bin());
    let mut cmd = unshare_as_test_user();
    let out = cmd.args(["-Ur", "sh", "-c", &inner]).env("PVISOR_HOME", &env.home).output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("MISSING  user namespaces"), "{stdout}");
    assert!(stdout.contains("max_user_namespaces"), "{stdout}");
}

/// Completions and man pages come from the binary's own definitions.
#[test]
fn completions_and_man_pages_are_generated_from_the_binary() {
    let env = Env::new(As::Rootless);
    let bash = env.expect(&["completions", "bash"], 0);
    assert!(
        bash.contains("_pvisor()") && bash.contains("apply") && bash.contains("--expose-socket"),
        "{bash}"
    );
    let zsh = env.expect(&["completions", "zsh"], 0);
    assert!(zsh.starts_with("#compdef pvisor"), "{zsh}");
    let page = env.expect(&["man"], 0);
    assert!(page.contains(".TH pvisor 1"), "{page}");
    let dir = env.dir.path().join("man1");
    env.give_away(env.dir.path());
    let said = env.expect(&["man", "--dir", dir.to_str().unwrap()], 0);
    assert!(said.contains("man pages"), "{said}");
    let apply = std::fs::read_to_string(dir.join("pvisor-apply.1")).unwrap();
    assert!(apply.contains(".TH pvisor-apply 1") && apply.contains("interactive"), "{apply}");
    let bad = env.pvisor(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(125), "{}", text(&bad.stderr));
}

#[test]
fn labels_are_recorded_shown_and_selected() {
    let env = Env::new(As::Rootless);
    let run = |labels: &[&str]| {
        let mut args = vec!["run", "-q"];
        for l in labels {
            args.extend(["--label", l]);
        }
        args.extend(["--", "true"]);
        assert_eq!(env.pvisor(&args).status.code(), Some(0));
    };
    run(&["team=infra", "example.com/container=web-1"]);
    // A key the frontends set is theirs: refused, naming it.
    let reserved = env.pvisor(&["run", "-q", "--label", "pvisor.serve/sandbox=x", "--", "true"]);
    assert_eq!(reserved.status.code(), Some(125), "{}", text(&reserved.stderr));
    assert!(text(&reserved.stderr).contains("reserved"), "{}", text(&reserved.stderr));
    run(&["team=infra"]);
    run(&[]);
    let selected = |selector: &[&str]| -> Vec<serde_json::Value> {
        let mut args = vec!["jobs", "--json"];
        for l in selector {
            args.extend(["--label", l]);
        }
        let out = env.pvisor(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        records_of(&text(&out.stdout), "job")
    };
    assert_eq!(selected(&[]).len(), 3);
    assert_eq!(selected(&["team=infra"]).len(), 2);
    let web = selected(&["team=infra", "example.com/container=web-1"]);
    assert_eq!(web.len(), 1);
    assert_eq!(web[0]["labels"]["example.com/container"], "web-1");
    assert!(selected(&["team=other"]).is_empty());
    let job = web[0]["job"].as_str().unwrap();
    let status = text(&env.pvisor(&["status", job]).stdout);
    assert!(status.contains("labels     example.com/container=web-1 team=infra"), "{status}");
    let created = env.events(job).into_iter().find(|e| e["type"] == "job.created").expect("job.created");
    assert_eq!(created["data"]["labels"]["team"], "infra");
}

#[test]
fn a_bad_label_is_refused_with_the_rule_and_nothing_is_recorded() {
    let env = Env::new(As::Rootless);
    for bad in ["no-equals", "bad key=x", "k=\u{1b}[2Jforged"] {
        let out = env.pvisor(&["run", "--label", bad, "--", "true"]);
        assert_eq!(out.status.code(), Some(125), "{bad:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("label"), "{}", text(&out.stderr));
    }
    let out = env.pvisor(&["run", "--label", "a=1", "--label", "a=2", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "a key given twice: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains("label a is given twice"), "{}", text(&out.stderr));
    assert!(records_of(&text(&env.pvisor(&["jobs", "--json"]).stdout), "job").is_empty());
}
