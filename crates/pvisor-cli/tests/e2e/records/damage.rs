//! Damaged and redirected records: every record truncated, flipped, deleted
//! or swapped is detected or harmless, and a run.json pointed elsewhere is
//! refused by name; none of it ever writes the workspace.

use super::*;

/// One way to damage a record.
#[derive(Clone, Copy, Debug)]
enum Damage {
    Truncate,
    BitFlip,
    Delete,
    SwapWithOtherJob,
}

fn damage(path: &Path, other: &Path, how: Damage, seed: usize) {
    match how {
        Damage::Truncate => {
            let bytes = fs::read(path).unwrap();
            fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
        }
        Damage::BitFlip => {
            let mut bytes = fs::read(path).unwrap();
            // Flip a bit inside a value, not only in whitespace.
            let candidates: Vec<usize> =
                (0..bytes.len()).filter(|&i| bytes[i].is_ascii_alphanumeric()).collect();
            let at = candidates[(seed * 7919) % candidates.len()];
            bytes[at] ^= 0x01;
            fs::write(path, bytes).unwrap();
        }
        Damage::Delete => fs::remove_file(path).unwrap(),
        Damage::SwapWithOtherJob => {
            fs::copy(other, path).unwrap();
        }
    }
}

#[test]
fn damaged_records_are_detected_or_harmless_and_never_write_the_workspace() {
    let records = [
        "job.json",
        "run.json",
        "attempts/1/attempt.json",
        "attempts/1/bundle.json",
        "attempts/1/completion.json",
        "events.jsonl",
        "stage/preimages.json",
        "stage/ledger.jsonl",
    ];
    let damages = [Damage::Truncate, Damage::BitFlip, Damage::Delete, Damage::SwapWithOtherJob];
    let (mut detected, mut harmless, mut cases) = (0, 0, 0);
    for (r, record) in records.iter().enumerate() {
        for (d, how) in damages.iter().enumerate() {
            cases += 1;
            let env = Env::new(As::Rootless);
            env.write("tracked", "base\n");
            // Two Jobs in two workspaces: the victim's records may be swapped with the other's.
            assert_eq!(env.run_sh("echo victim > tracked; echo new > added").status.code(), Some(0));
            let victim = only_job(&env);
            let other_ws = env.dir.path().join("other");
            fs::create_dir(&other_ws).unwrap();
            fs::write(other_ws.join("tracked"), "other-base\n").unwrap();
            env.give_away(&other_ws);
            let ws_arg = other_ws.to_string_lossy().into_owned();
            env.expect(&["run", "-w", &ws_arg, "--", "sh", "-c", "echo other > tracked; rm -f tracked"], 0);
            let other = job_ids(&env).into_iter().find(|j| *j != victim).unwrap();
            // Both Jobs have a ledger: each applied one change.
            env.expect(&["apply", &victim, "added"], 0);
            env.expect(&["apply", &other, "tracked"], 0);
            let genuine = env.status_json(Some(&victim));
            let (victim_dir, other_dir) = (run_dir(&env, &victim), run_dir(&env, &other));
            let job_dir = |job: &str| env.home.join("jobs").join(job);
            let (path, other_path) = if *record == "job.json" {
                (job_dir(&victim).join(record), job_dir(&other).join(record))
            } else {
                (victim_dir.join(record), other_dir.join(record))
            };
            let before_victim = snapshot(&env.ws);
            let before_other = snapshot(&other_ws);
            damage(&path, &other_path, *how, r * 31 + d);

            let verify = env.pvisor(&["verify", &victim]);
            let apply = env.pvisor(&["apply", &victim, "--all"]);
            let case = format!("{record} × {how:?}");
            assert_eq!(snapshot(&other_ws), before_other, "{case}: the other Job's workspace was written");
            // Only the Trace's torn or unbound tail and the ledger (which apply
            // re-derives from the workspace) may go undetected; everything
            // else the receipt binds must be caught.
            let may_pass = (*record == "events.jsonl" && !matches!(how, Damage::SwapWithOtherJob))
                || *record == "stage/ledger.jsonl";
            assert!(!verify.status.success() || may_pass, "{case}: damage went undetected");
            if verify.status.success() {
                // Not detected: then it must be harmless — the same confirmed
                // result, and apply wrote exactly the genuine staged changes.
                let now = env.status_json(Some(&victim));
                for field in ["state", "exit_code", "workspace", "program", "args", "run", "changes"] {
                    assert_eq!(now[field], genuine[field], "{case}: verify passed but {field} changed");
                }
                assert_eq!(apply.status.code(), Some(0), "{case}: {}", text(&apply.stderr));
                assert_eq!(fs::read_to_string(env.ws.join("tracked")).unwrap(), "victim\n", "{case}");
                assert_eq!(fs::read_to_string(env.ws.join("added")).unwrap(), "new\n", "{case}");
                eprintln!("  {case}: not detected, harmless");
                harmless += 1;
            } else {
                assert_ne!(apply.status.code(), Some(0), "{case}: verify failed but apply succeeded");
                assert_eq!(snapshot(&env.ws), before_victim, "{case}: a damaged record led to a write");
                detected += 1;
            }
        }
    }
    eprintln!(
        "damaged-record corpus: {cases} cases, {detected} detected, {harmless} harmless, 0 false successes"
    );
    assert_eq!(detected + harmless, cases);
}

#[test]
fn a_run_json_pointed_elsewhere_or_given_another_command_is_refused_by_name() {
    let env = Env::new(As::Rootless);
    assert_eq!(env.run_sh("echo staged > f").status.code(), Some(0));
    let job = only_job(&env);
    let run_json = run_dir(&env, &job).join("run.json");
    let original = fs::read_to_string(&run_json).unwrap();
    let elsewhere = env.dir.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    env.give_away(&elsewhere);
    let ws = env.ws.canonicalize().unwrap().to_string_lossy().into_owned();
    let moved = original.replace(&format!("\"{ws}\""), &format!("\"{}\"", elsewhere.display()));
    assert_ne!(moved, original);
    fs::write(&run_json, moved).unwrap();
    // verify says "failed" (1); the others cannot proceed (125).
    for (args, code) in [(&["apply", "--all"][..], 125), (&["verify", &job][..], 1), (&["status"][..], 125)] {
        let out = env.pvisor(args);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(said.contains("run.json does not match"), "{args:?}: {said}");
    }
    assert!(!elsewhere.join("f").exists(), "apply wrote to the workspace a tampered run.json named");
    let commanded = original.replace("\"program\": \"sh\"", "\"program\": \"rm\"");
    assert_ne!(commanded, original);
    fs::write(&run_json, commanded).unwrap();
    let out = env.pvisor(&["verify", &job]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("run.json does not match"), "{}", text(&out.stdout));
    fs::write(&run_json, original).unwrap();
    env.expect(&["verify", &job], 0);
}
