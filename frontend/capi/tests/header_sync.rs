//! include/vrdma.h and libvrdma agree: the header's functions are exactly the library's
//! exported `vrdma_*` symbols (shared and static library), every one has the prototype
//! tests/abi/prototypes.c spells (a C compile with `_Static_assert`s; the Rust side checks
//! the same list in src/lib.rs), the structs have the same layout, and a program built
//! through the pkg-config file links and runs.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::*;

/// Names of the functions declared in the header (comments and macros stripped).
fn header_functions() -> BTreeSet<String> {
    let h = std::fs::read_to_string(crate_dir().join("include/vrdma.h")).unwrap();
    let mut text = String::new();
    let mut rest = h.as_str();
    while let Some(i) = rest.find("/*") {
        text.push_str(&rest[..i]);
        rest = &rest[i + rest[i..].find("*/").expect("closed comment") + 2..];
    }
    text.push_str(rest);
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while let Some(p) = code[i..].find("vrdma_") {
        let s = i + p;
        let mut e = s;
        while e < bytes.len() && (bytes[e].is_ascii_alphanumeric() || bytes[e] == b'_') {
            e += 1;
        }
        let before_ok = s == 0 || !(bytes[s - 1].is_ascii_alphanumeric() || bytes[s - 1] == b'_');
        let after = code[e..].trim_start();
        if before_ok && after.starts_with('(') {
            names.insert(code[s..e].to_string());
        }
        i = e;
    }
    names
}

fn exported(lib: &std::path::Path, dynamic: bool) -> BTreeSet<String> {
    let mut cmd = Command::new("nm");
    if dynamic {
        cmd.arg("-D");
    }
    let out = cmd
        .args(["--defined-only", "-g"])
        .arg(lib)
        .output()
        .expect("nm (binutils) is needed");
    assert!(out.status.success(), "nm {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [_, "T", name] if name.starts_with("vrdma_") => Some(name.to_string()),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn header_lists_exactly_the_exported_functions() {
    let (so, a) = libvrdma();
    let header = header_functions();
    assert!(header.len() >= 30, "header parse found only {header:?}");
    let dynamic = exported(&so, true);
    assert_eq!(
        header,
        dynamic,
        "header vs libvrdma.so: only in header {:?}, only in library {:?}",
        header.difference(&dynamic).collect::<Vec<_>>(),
        dynamic.difference(&header).collect::<Vec<_>>()
    );
    let stat = exported(&a, false);
    assert_eq!(header, stat, "header vs libvrdma.a");
}

#[test]
fn every_prototype_is_checked_and_matches() {
    let (_, a) = libvrdma();
    let c = crate_dir().join("tests/abi/prototypes.c");
    let src = std::fs::read_to_string(&c).unwrap();
    let checked: BTreeSet<String> = src
        .lines()
        .filter_map(|l| l.strip_prefix("CHECK("))
        .map(|l| l.split(',').next().unwrap().trim().to_string())
        .collect();
    assert_eq!(
        checked,
        header_functions(),
        "tests/abi/prototypes.c must CHECK every function of the header"
    );
    let tmp = tempfile::tempdir().unwrap();
    write_pc(tmp.path());
    let flags = pkg_config(tmp.path());
    let libdir = lib_dir();
    // Shared library through pkg-config (with an rpath so it runs from the build tree).
    let exe = tmp.path().join("prototypes");
    let mut args: Vec<String> = vec![
        "-std=c11".into(),
        "-Wall".into(),
        "-Wextra".into(),
        "-Werror".into(),
        c.display().to_string(),
        "-o".into(),
        exe.display().to_string(),
    ];
    args.extend(flags.iter().cloned());
    args.push(format!("-Wl,-rpath,{}", libdir.display()));
    gcc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let out = Command::new(&exe).output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ctx is NULL"));
    // Static library.
    let exe_s = tmp.path().join("prototypes-static");
    let inc = format!("-I{}", crate_dir().join("include").display());
    gcc(&[
        "-std=c11",
        "-Wall",
        "-Werror",
        &inc,
        c.to_str().unwrap(),
        a.to_str().unwrap(),
        "-lpthread",
        "-ldl",
        "-lm",
        "-o",
        exe_s.to_str().unwrap(),
    ]);
    assert!(Command::new(&exe_s).status().unwrap().success());
}

#[test]
fn the_header_parser_sees_a_missing_function() {
    // The sync check must be able to fail: a header function the library lacks shows up.
    let mut h = header_functions();
    h.insert("vrdma_not_there".into());
    let (so, _) = libvrdma();
    assert_ne!(h, exported(&so, true));
}
