//! Symbol versions: libibverbs.so.1 (and librdmacm.so.1, `RDMACM_1.x`) exports `ibv_open_device@@IBVERBS_1.1` etc., and programs
//! linked against it ask for those exact versions. `exports.txt` lists the symbols this library
//! defines; this writes the version script (the version nodes) and the `.symver` directives
//! that give each Rust function `vrdma_verbs_<name>` (through a one-jump stub) the public name
//! `<name>@@<version>`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let list = dir.join("exports.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    let text = std::fs::read_to_string(&list).expect("read exports.txt");
    // Version nodes in libibverbs' order (each public node inherits the previous one).
    let order = [
        "IBVERBS_1.0",
        "IBVERBS_1.1",
        "IBVERBS_1.5",
        "IBVERBS_1.6",
        "IBVERBS_1.7",
        "IBVERBS_1.8",
        "IBVERBS_1.9",
        "IBVERBS_1.10",
        "IBVERBS_1.11",
        "IBVERBS_1.12",
        "IBVERBS_1.13",
        "IBVERBS_1.14",
        "IBVERBS_PRIVATE_34",
        "RDMACM_1.0",
        "RDMACM_1.1",
        "RDMACM_1.2",
        "RDMACM_1.3",
    ];
    let mut by_ver: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut symver = String::from(".text\n");
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, ver) = line.split_once(' ').expect("`name VERSION` lines");
        let ver = ver.trim();
        assert!(order.contains(&ver), "unknown version {ver} in exports.txt");
        by_ver.entry(ver).or_default().push(name);
        // A tail-jump stub in the same object as its `.symver` (the Rust function may sit in
        // another codegen unit, and `.symver` needs a local definition).
        writeln!(
            symver,
            ".globl vrdma_sv_{name}\n.type vrdma_sv_{name},@function\nvrdma_sv_{name}:\n    \
             jmp vrdma_verbs_{name}@PLT\n.size vrdma_sv_{name}, .-vrdma_sv_{name}\n\
             .symver vrdma_sv_{name}, {name}@@{ver}"
        )
        .unwrap();
    }
    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for v in order {
        let names = by_ver.get(v).cloned().unwrap_or_default();
        writeln!(map, "{v} {{").unwrap();
        if !names.is_empty() {
            writeln!(map, "  global:").unwrap();
            for n in names {
                writeln!(map, "    {n};").unwrap();
            }
        }
        // A public node inherits the previous one of its library; the private node and the
        // first of librdmacm's inherit nothing.
        let family = |n: &str| n.split('_').next().map(str::to_owned);
        match prev {
            Some(p)
                if v != "IBVERBS_PRIVATE_34"
                    && p != "IBVERBS_PRIVATE_34"
                    && family(p) == family(v) =>
            {
                writeln!(map, "}} {p};").unwrap()
            }
            _ => writeln!(map, "}};").unwrap(),
        }
        prev = Some(v);
    }
    std::fs::write(out.join("verbs.map"), map).unwrap();
    std::fs::write(out.join("symver.s"), symver).unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        out.join("verbs.map").display()
    );
}
