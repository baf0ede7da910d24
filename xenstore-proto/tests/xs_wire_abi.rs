//! The codec agrees with Xen's own `io/xs_wire.h` (Debian `libxen-dev`): a C program compiled
//! against the installed header prints every constant, enum value, struct offset and the
//! `xsd_errors[]` table, and each is compared with ours.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use xenstore_proto::wire::{self, MsgType, WireError, XsErrno};

const HEADER: &str = "/usr/include/xen/io/xs_wire.h";

const PROGRAM: &str = r#"
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <xen/io/xs_wire.h>
#define P(name, value) printf("%s %lu\n", name, (unsigned long)(value))
int main(void) {
    P("sizeof_xsd_sockmsg", sizeof(struct xsd_sockmsg));
    P("off_type", offsetof(struct xsd_sockmsg, type));
    P("off_req_id", offsetof(struct xsd_sockmsg, req_id));
    P("off_tx_id", offsetof(struct xsd_sockmsg, tx_id));
    P("off_len", offsetof(struct xsd_sockmsg, len));
    P("XS_CONTROL", XS_CONTROL); P("XS_DIRECTORY", XS_DIRECTORY); P("XS_READ", XS_READ);
    P("XS_GET_PERMS", XS_GET_PERMS); P("XS_WATCH", XS_WATCH); P("XS_UNWATCH", XS_UNWATCH);
    P("XS_TRANSACTION_START", XS_TRANSACTION_START);
    P("XS_TRANSACTION_END", XS_TRANSACTION_END); P("XS_INTRODUCE", XS_INTRODUCE);
    P("XS_RELEASE", XS_RELEASE); P("XS_GET_DOMAIN_PATH", XS_GET_DOMAIN_PATH);
    P("XS_WRITE", XS_WRITE); P("XS_MKDIR", XS_MKDIR); P("XS_RM", XS_RM);
    P("XS_SET_PERMS", XS_SET_PERMS); P("XS_WATCH_EVENT", XS_WATCH_EVENT);
    P("XS_ERROR", XS_ERROR); P("XS_IS_DOMAIN_INTRODUCED", XS_IS_DOMAIN_INTRODUCED);
    P("XS_RESUME", XS_RESUME); P("XS_SET_TARGET", XS_SET_TARGET);
    P("XS_RESET_WATCHES", XS_RESET_WATCHES); P("XS_DIRECTORY_PART", XS_DIRECTORY_PART);
    P("XS_TYPE_COUNT", XS_TYPE_COUNT); P("XS_INVALID", XS_INVALID);
    P("XS_WATCH_PATH", XS_WATCH_PATH); P("XS_WATCH_TOKEN", XS_WATCH_TOKEN);
    P("XENSTORE_PAYLOAD_MAX", XENSTORE_PAYLOAD_MAX);
    P("XENSTORE_ABS_PATH_MAX", XENSTORE_ABS_PATH_MAX);
    P("XENSTORE_REL_PATH_MAX", XENSTORE_REL_PATH_MAX);
    printf("XS_WRITE_NONE %s\nXS_WRITE_CREATE %s\nXS_WRITE_CREATE_EXCL %s\n",
           XS_WRITE_NONE, XS_WRITE_CREATE, XS_WRITE_CREATE_EXCL);
    for (size_t i = 0; i < sizeof(xsd_errors) / sizeof(xsd_errors[0]); i++)
        printf("error%zu %s %d\n", i, xsd_errors[i].errstring, xsd_errors[i].errnum);
    return 0;
}
"#;

fn c_facts() -> HashMap<String, String> {
    assert!(
        Path::new(HEADER).exists(),
        "{HEADER} is missing: install Debian's libxen-dev (scripts/test-all.sh does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("abi.c");
    let exe = dir.path().join("abi");
    std::fs::write(&src, PROGRAM).unwrap();
    let out = Command::new("gcc")
        .arg("-Wall")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("gcc is needed for the ABI test (apt-get install gcc)");
    assert!(
        out.status.success(),
        "gcc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

#[test]
fn codec_matches_xs_wire_h() {
    let c = c_facts();
    let num = |k: &str| -> u64 { c[k].parse().unwrap_or_else(|_| panic!("{k}={}", c[k])) };

    assert_eq!(num("sizeof_xsd_sockmsg") as usize, wire::HEADER_LEN);
    // Offsets: check through the view, writing distinct values and reading raw words.
    let frame = wire::encode_frame(MsgType::Read, 0x1111_1111, 0x2222_2222, b"/\0").unwrap();
    let word =
        |off: u64| u32::from_ne_bytes(frame[off as usize..off as usize + 4].try_into().unwrap());
    assert_eq!(word(num("off_type")), MsgType::Read.as_u32());
    assert_eq!(word(num("off_req_id")), 0x1111_1111);
    assert_eq!(word(num("off_tx_id")), 0x2222_2222);
    assert_eq!(word(num("off_len")), 2);

    // Every type the installed header defines has our number and our name.
    let mut checked = 0;
    for ty in MsgType::ALL {
        let key = format!("XS_{}", ty.name());
        if let Some(v) = c.get(&key) {
            assert_eq!(v.parse::<u32>().unwrap(), ty.as_u32(), "{key}");
            checked += 1;
        } else {
            // Types newer than the installed header (GET/SET_FEATURE, GET/SET_QUOTA on
            // Xen 4.17) must number from the header's XS_TYPE_COUNT upwards.
            assert!(
                ty.as_u32() >= num("XS_TYPE_COUNT") as u32,
                "{key} missing from header"
            );
        }
    }
    assert!(checked >= 22, "only {checked} types found in the header");
    assert_eq!(num("XS_INVALID") as u32, MsgType::INVALID);
    assert_eq!(
        MsgType::from_u32(MsgType::INVALID),
        Err(WireError::UnknownType(MsgType::INVALID))
    );
    // A WATCH_EVENT carries the path first, then the token.
    assert_eq!((num("XS_WATCH_PATH"), num("XS_WATCH_TOKEN")), (0, 1));

    assert_eq!(num("XENSTORE_PAYLOAD_MAX") as usize, wire::PAYLOAD_MAX);
    assert_eq!(num("XENSTORE_ABS_PATH_MAX") as usize, wire::ABS_PATH_MAX);
    assert_eq!(num("XENSTORE_REL_PATH_MAX") as usize, wire::REL_PATH_MAX);
    assert_eq!(c["XS_WRITE_NONE"], wire::WRITE_NONE);
    assert_eq!(c["XS_WRITE_CREATE"], wire::WRITE_CREATE);
    assert_eq!(c["XS_WRITE_CREATE_EXCL"], wire::WRITE_CREATE_EXCL);

    // xsd_errors[]: same names, same order, same errno numbers.
    let mut n = 0;
    while let Some(line) = c.get(&format!("error{n}")) {
        let (name, code) = line.split_once(' ').unwrap();
        let ours = XsErrno::ALL
            .get(n)
            .unwrap_or_else(|| panic!("header has extra error {name}"));
        assert_eq!(ours.name(), name, "xsd_errors[{n}]");
        assert_eq!(ours.code(), code.parse::<i32>().unwrap(), "errno of {name}");
        n += 1;
    }
    assert_eq!(n, XsErrno::ALL.len(), "xsd_errors[] length");
}
