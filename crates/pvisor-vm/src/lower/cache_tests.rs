use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::*;

struct Fixture {
    _dir: tempfile::TempDir,
    state: PathBuf,
    ws: PathBuf,
    vm: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (state, ws, vm) = (dir.path().join("state"), dir.path().join("ws"), dir.path().join("vm"));
        for d in [&state, &ws, &vm] {
            fs::create_dir_all(d).unwrap();
        }
        Self { _dir: dir, state, ws, vm }
    }

    fn write(&self, rel: &str, text: &str) {
        let path = self.ws.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    /// Stamps `rels` with one "now", so all of them are just written
    /// however long writing them took on a loaded host: a pass is repeated
    /// until it takes less than a quarter of the racy margin.
    fn restamp(&self, rels: &[String]) {
        for _ in 0..10 {
            let pass = std::time::Instant::now();
            for rel in rels {
                let file = fs::File::options().write(true).open(self.ws.join(rel)).unwrap();
                file.set_modified(std::time::SystemTime::now()).unwrap();
            }
            if (pass.elapsed().as_nanos() as i64) < base::RACY_MARGIN_NS / 4 {
                return;
            }
        }
        panic!("the host is too loaded to stamp {} files within a quarter of the racy margin", rels.len());
    }

    fn prepare(&self) -> Prepared {
        self.prepare_into(&self.vm)
    }

    fn prepare_into(&self, vm: &Path) -> Prepared {
        prepare(&self.state, &self.ws, &vm.join("lower.img"), &vm.join("delta.img"), &vm.join("staging"))
            .unwrap()
    }

    fn cache(&self) -> PathBuf {
        base::cache_dir(&self.state, &fs::canonicalize(&self.ws).unwrap())
    }

    /// As if the workspace had been written long before the base was
    /// built: nothing in it is racy against the published base.
    fn age_base(&self) {
        let path = self.cache().join("current.json");
        let mut manifest: BaseManifest = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        manifest.clean_before_ns = manifest.build_start_ns;
        fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    }
}

#[test]
fn the_base_is_built_once_then_reused_with_a_delta_of_what_changed() {
    let f = Fixture::new();
    f.write("a", &"a".repeat(100));
    f.write("d/b", "b");
    let first = f.prepare();
    assert_eq!(first.rebuilt.as_deref(), Some("no base image of this workspace yet"));
    let image = base::image_path(&f.cache(), &first.base);
    assert_eq!(fs::metadata(f.vm.join("lower.img")).unwrap().ino(), fs::metadata(&image).unwrap().ino());
    assert_eq!(fs::metadata(&image).unwrap().len(), crate::disk::LOWER_DISK_BYTES);
    // Just written, so racy against that build: all of it is in the delta.
    assert_eq!(first.delta_entries, 4);

    f.age_base();
    let unchanged = f.prepare();
    assert_eq!((unchanged.base.as_str(), unchanged.rebuilt.as_deref()), (first.base.as_str(), None));
    assert_eq!((unchanged.delta_entries, unchanged.delta_bytes), (1, 0), "only the root's metadata");

    f.write("d/b", "edited");
    let edited = f.prepare();
    assert_eq!((edited.base.as_str(), edited.rebuilt.as_deref()), (first.base.as_str(), None));
    assert_eq!((edited.delta_entries, edited.delta_bytes), (3, 6), "the root, d and d/b");
}

#[test]
fn a_large_change_rebuilds_the_base_and_running_vms_keep_the_old_one() {
    let f = Fixture::new();
    f.write("big", &"x".repeat(4000));
    f.write("small", "s");
    let first = f.prepare();
    f.age_base();
    let old_lower = f.vm.join("lower.img");
    let old_ino = fs::metadata(&old_lower).unwrap().ino();

    f.write("small", &"y".repeat(2000));
    let vm2 = f.vm.join("second");
    fs::create_dir_all(&vm2).unwrap();
    let second = f.prepare_into(&vm2);
    let why = second.rebuilt.expect("rebuilt");
    assert!(why.contains("bytes changed") && why.contains("quarter"), "{why}");
    assert_ne!(second.base, first.base);
    assert!(!base::image_path(&f.cache(), &first.base).exists(), "the old base is unpublished");
    assert_eq!(fs::metadata(&old_lower).unwrap().ino(), old_ino, "the first VM's link still holds it");

    f.age_base();
    for i in 0..=REBASE_ENTRIES {
        f.write(&format!("many/{i}"), "");
    }
    let third = f.prepare();
    assert!(third.rebuilt.expect("rebuilt").contains("entries changed"));
}

#[test]
fn a_damaged_cache_or_a_killed_build_is_never_used() {
    let f = Fixture::new();
    f.write("a", "a");
    let first = f.prepare();
    let cache = f.cache();
    // A build killed before its rename leaves only a temporary.
    fs::write(cache.join("tmp-dead.img"), b"half").unwrap();
    let image = base::image_path(&cache, &first.base);
    fs::OpenOptions::new().append(true).open(&image).unwrap().set_len(1).unwrap();
    let second = f.prepare();
    assert!(second.rebuilt.expect("rebuilt").contains("changed after it was published"));
    assert!(!cache.join("tmp-dead.img").exists(), "the next builder removes a killed build's leftovers");

    let index = cache.join(format!("base-{}.index", second.base));
    let mut bytes = fs::read(&index).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    fs::write(&index, bytes).unwrap();
    assert!(f.prepare().rebuilt.expect("rebuilt").contains("digest"));

    fs::write(cache.join("current.json"), b"{").unwrap();
    assert!(f.prepare().rebuilt.expect("rebuilt").contains("corrupt"));
}

#[test]
fn two_starts_at_once_build_one_base_and_both_use_it() {
    let f = Fixture::new();
    for i in 0..200 {
        f.write(&format!("d{}/f{i}", i % 7), &"z".repeat(i));
    }
    // Older than the racy margin by the time the base is built.
    std::thread::sleep(std::time::Duration::from_millis(base::RACY_MARGIN_NS as u64 / 1_000_000 + 100));
    let barrier = std::sync::Barrier::new(2);
    let results: Vec<Prepared> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|n| {
                let (f, barrier) = (&f, &barrier);
                s.spawn(move || {
                    let vm = f.vm.join(format!("vm{n}"));
                    fs::create_dir_all(&vm).unwrap();
                    barrier.wait();
                    f.prepare_into(&vm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results.iter().filter(|p| p.rebuilt.is_some()).count(), 1, "{results:?}");
    assert_eq!(results[0].base, results[1].base);
    for p in &results {
        assert_eq!((p.delta_entries, p.delta_bytes), (1, 0), "{p:?}");
    }
}

#[test]
fn gc_retires_a_cache_only_when_no_start_holds_it() {
    let f = Fixture::new();
    f.write("a", "a");
    f.prepare();
    let (caches, retired) = lower_caches(&f.state);
    assert!(retired.is_empty());
    assert_eq!(caches.len(), 1);
    assert_eq!(caches[0].workspace.as_deref(), Some(fs::canonicalize(&f.ws).unwrap().as_path()));
    assert!(caches[0].last_used.is_some());

    let held = CacheLock::take(&f.cache(), false).unwrap();
    assert!(caches[0].retire().unwrap().is_none(), "a start is reading it");
    drop(held);
    let aside = caches[0].retire().unwrap().expect("retired");
    assert!(!f.cache().exists() && aside.exists());
    assert_eq!(lower_caches(&f.state).1, [aside]);
    // The next start builds afresh.
    assert!(f.prepare().rebuilt.is_some());
}

#[test]
fn a_large_workspace_written_just_now_is_waited_out_rather_than_copied_twice() {
    let f = Fixture::new();
    let many: Vec<String> = (0..=REBASE_ENTRIES).map(|i| format!("many/{i}")).collect();
    for rel in &many {
        f.write(rel, "");
    }
    // All of them within the margin, or fewer than REBASE_ENTRIES would be
    // racy and there would be nothing to wait out.
    f.restamp(&many);
    let started = std::time::Instant::now();
    let first = f.prepare();
    assert!(first.rebuilt.is_some());
    // Built once the margin had passed, so nothing in it is racy: without
    // the wait, all 2,000 entries would be in this delta and the next.
    assert_eq!(first.delta_entries, 1, "{first:?}");
    assert!(started.elapsed().as_nanos() as i64 >= base::RACY_MARGIN_NS / 2, "it waited");
    assert_eq!((f.prepare().rebuilt, f.prepare().delta_entries), (None, 1));
}
