//! The fuzz corpus on the stable toolchain: every file under
//! `fuzz/corpus/TARGET/` goes through the same entry point its fuzz
//! target calls (`threeproxy::fuzzing`), so the seeds and every input a
//! fuzzing run once crashed on are checked on each test run, without
//! nightly or libFuzzer.

use std::collections::BTreeSet;
use std::path::Path;

use threeproxy::fuzzing::TARGETS;

fn corpus() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus")
}

#[test]
fn every_corpus_file_passes_its_target() {
    let mut total = 0;
    for (name, run) in TARGETS {
        let dir = corpus().join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no seed for target {name}");
        for f in files {
            let data = std::fs::read(&f).unwrap();
            let r = std::panic::catch_unwind(|| run(&data));
            assert!(r.is_ok(), "{name}: {} fails its target", f.display());
            total += 1;
        }
    }
    eprintln!(
        "fuzz corpus: {total} inputs through {} targets",
        TARGETS.len()
    );
}

#[test]
fn every_target_has_a_fuzz_binary_and_a_corpus() {
    let names: BTreeSet<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    let dirs: BTreeSet<String> = std::fs::read_dir(corpus())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let bins: BTreeSet<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/fuzz_targets"))
            .unwrap()
            .map(|e| {
                let n = e.unwrap().file_name().to_string_lossy().into_owned();
                n.strip_suffix(".rs").unwrap_or(&n).to_string()
            })
            .collect();
    let names: BTreeSet<String> = names.into_iter().map(String::from).collect();
    assert_eq!(dirs, names, "fuzz/corpus/ and fuzzing::TARGETS differ");
    assert_eq!(
        bins, names,
        "fuzz/fuzz_targets/ and fuzzing::TARGETS differ"
    );
}
