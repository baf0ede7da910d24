//! The Rust types of `verbs-abi` against rdma-core's own headers: `tests/abi/verbs_abi.c`,
//! compiled against `/usr/include/infiniband/verbs.h` and `/usr/include/rdma/rdma_cma.h`,
//! prints every size, offset and constant of `verbs_abi::layout_table()`; they must agree.
//!
//! Needs `gcc`, `libibverbs-dev` and `librdmacm-dev` (scripts/host-packages.txt). Without the
//! headers the test FAILS, unless `VRDMA_SKIP_VERBS_ABI=1` is set, in which case it prints
//! that it did not run.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const SKIP_VAR: &str = "VRDMA_SKIP_VERBS_ABI";

fn skipped() -> bool {
    if std::env::var_os(SKIP_VAR).is_some_and(|v| v == "1") {
        eprintln!(
            "\n*** VERBS ABI TEST DID NOT RUN: {SKIP_VAR}=1 is set; the verbs-abi layouts were \
             NOT checked against rdma-core's headers ***\n"
        );
        return true;
    }
    false
}

fn c_table() -> BTreeMap<String, i64> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abi/verbs_abi.c");
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("verbs_abi");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "VERBS ABI TEST DID NOT RUN: cannot start the C compiler `{cc}`: {e} \
                 (apt-get install gcc libc6-dev libibverbs-dev librdmacm-dev; \
                 or set {SKIP_VAR}=1 to skip it knowingly)"
            )
        });
    assert!(
        out.status.success(),
        "VERBS ABI TEST DID NOT RUN: compiling {} failed (are libibverbs-dev and librdmacm-dev \
         installed? set {SKIP_VAR}=1 to skip it knowingly):\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let mut table = BTreeMap::new();
    for line in String::from_utf8(run.stdout).unwrap().lines() {
        let (k, v) = line.rsplit_once(' ').expect("`name value` lines");
        let dup = table.insert(k.to_string(), v.parse().expect("decimal value"));
        assert!(dup.is_none(), "the C program prints {k} twice");
    }
    table
}

fn compare(c: &BTreeMap<String, i64>, rust: &[(&str, i64)]) -> Result<(), String> {
    for (name, value) in rust {
        match c.get(*name) {
            None => return Err(format!("the C program lacks {name}")),
            Some(cv) if cv != value => {
                return Err(format!("{name}: C says {cv}, Rust says {value}"))
            }
            Some(_) => {}
        }
    }
    if c.len() != rust.len() {
        let extra: Vec<_> = c
            .keys()
            .filter(|k| !rust.iter().any(|(n, _)| n == k))
            .cloned()
            .collect();
        return Err(format!("layout_table() lacks {extra:?}"));
    }
    Ok(())
}

#[test]
fn layouts_and_constants_match_rdma_core_headers() {
    if skipped() {
        return;
    }
    let c = c_table();
    let rust = verbs_abi::layout_table();
    assert!(
        rust.len() > 500,
        "the table covers every type, field and constant"
    );
    if let Err(e) = compare(&c, &rust) {
        panic!("verbs-abi disagrees with rdma-core's headers: {e}");
    }
}

/// The comparison catches one wrong number, a missing entry and an extra one.
#[test]
fn comparison_fails_on_any_difference() {
    if skipped() {
        return;
    }
    let c = c_table();
    let rust = verbs_abi::layout_table();
    // The offset of `post_send` in `ibv_context_ops` (what the static-inline verbs call).
    let i = rust
        .iter()
        .position(|(n, _)| *n == "offsetof ibv_context_ops.post_send")
        .unwrap();
    let mut wrong = rust.clone();
    wrong[i].1 += 8;
    assert_eq!(
        compare(&c, &wrong),
        Err(format!(
            "offsetof ibv_context_ops.post_send: C says {}, Rust says {}",
            rust[i].1, wrong[i].1
        ))
    );
    let mut missing = rust.clone();
    let gone = missing.remove(i).0;
    assert_eq!(
        compare(&c, &missing),
        Err(format!("layout_table() lacks [{gone:?}]"))
    );
    let mut extra = rust.clone();
    extra.push(("sizeof ibv_not_a_type", 1));
    assert_eq!(
        compare(&c, &extra),
        Err("the C program lacks sizeof ibv_not_a_type".into())
    );
}

/// The dispatch slots the static inlines use sit where verbs.h puts them (hand-counted from
/// the header: 11th, 12th, 25th and 26th pointer of `ibv_context_ops`, `ops` at offset 8).
#[test]
fn context_ops_dispatch_slots() {
    use std::mem::offset_of;
    use verbs_abi::verbs::{ibv_context, ibv_context_ops};
    assert_eq!(offset_of!(ibv_context, ops), 8);
    assert_eq!(offset_of!(ibv_context_ops, poll_cq), 11 * 8);
    assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 12 * 8);
    assert_eq!(offset_of!(ibv_context_ops, post_send), 25 * 8);
    assert_eq!(offset_of!(ibv_context_ops, post_recv), 26 * 8);
}
