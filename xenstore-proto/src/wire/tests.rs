//! Codec tests: literal bytes in, meaning out, and the same bytes back.
// Payloads are nul-separated decimal strings, so `\0` followed by digits is the wire as it is.
#![allow(clippy::octal_escapes)]

use super::*;

fn frame(ty: u32, req_id: u32, tx_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    for word in [ty, req_id, tx_id, payload.len() as u32] {
        v.extend_from_slice(&word.to_ne_bytes());
    }
    v.extend_from_slice(payload);
    v
}

#[test]
fn header_fields_are_host_order_at_fixed_offsets() {
    let bytes = frame(2, 0x01020304, 7, b"/a\0");
    let packet = Packet::new_checked(&bytes[..]).unwrap();
    assert_eq!(packet.msg_type().unwrap(), MsgType::Read);
    assert_eq!(packet.req_id(), 0x01020304);
    assert_eq!(packet.tx_id(), 7);
    assert_eq!(packet.payload(), b"/a\0");
    assert_eq!(packet.total_len(), 19);
    let mut again = vec![0u8; 16];
    packet.header().unwrap().emit(&mut again);
    assert_eq!(again, bytes[..16]);
}

#[test]
fn message_type_numbers_follow_xs_wire_h() {
    for (i, ty) in MsgType::ALL.iter().enumerate() {
        let raw = if i < 20 { i as u32 } else { i as u32 + 1 };
        assert_eq!(ty.as_u32(), raw, "{ty}");
        assert_eq!(MsgType::from_u32(raw).unwrap(), *ty);
    }
    assert_eq!(MsgType::from_u32(20), Err(WireError::UnknownType(20)));
    assert_eq!(MsgType::from_u32(27), Err(WireError::UnknownType(27)));
    assert_eq!(
        MsgType::from_u32(MsgType::INVALID),
        Err(WireError::UnknownType(MsgType::INVALID))
    );
}

#[test]
fn checked_view_rejects_short_and_oversized() {
    assert_eq!(
        Packet::new_checked(&[0u8; 15][..]).unwrap_err(),
        WireError::Truncated { need: 16, have: 15 }
    );
    let mut bytes = frame(2, 1, 0, b"/abc\0");
    bytes.pop();
    assert_eq!(
        Packet::new_checked(&bytes[..]).unwrap_err(),
        WireError::Truncated { need: 21, have: 20 }
    );
    let mut huge = frame(2, 1, 0, b"");
    huge[12..16].copy_from_slice(&4097u32.to_ne_bytes());
    assert_eq!(
        Packet::new_checked(&huge[..]).unwrap_err(),
        WireError::PayloadTooLong(4097)
    );
    let max = frame(11, 1, 0, &[b'a'; PAYLOAD_MAX]);
    assert!(Packet::new_checked(&max[..]).is_ok());
}

/// Each request, from the bytes libxenstore sends, parses to its meaning and emits the same.
#[test]
fn requests_round_trip_from_literal_bytes() {
    let cases: Vec<(MsgType, &[u8], Request)> = vec![
        (
            MsgType::Read,
            b"/local/domain/1/name\0",
            Request::Read {
                path: "/local/domain/1/name",
            },
        ),
        (
            MsgType::Directory,
            b"device\0",
            Request::Directory { path: "device" },
        ),
        (
            MsgType::DirectoryPart,
            b"/local/domain\0128\0",
            Request::DirectoryPart {
                path: "/local/domain",
                offset: 128,
            },
        ),
        (MsgType::GetPerms, b"/a\0", Request::GetPerms { path: "/a" }),
        (
            MsgType::Watch,
            b"/a/b\0tok\0",
            Request::Watch {
                path: "/a/b",
                token: "tok",
            },
        ),
        (
            MsgType::Watch,
            b"@releaseDomain\0t1\0",
            Request::Watch {
                path: "@releaseDomain",
                token: "t1",
            },
        ),
        (
            MsgType::Unwatch,
            b"/a\0tok\0",
            Request::Unwatch {
                path: "/a",
                token: "tok",
            },
        ),
        (MsgType::TransactionStart, b"\0", Request::TransactionStart),
        (
            MsgType::TransactionEnd,
            b"T\0",
            Request::TransactionEnd { commit: true },
        ),
        (
            MsgType::TransactionEnd,
            b"F\0",
            Request::TransactionEnd { commit: false },
        ),
        (
            MsgType::Introduce,
            b"3\01234\05\0",
            Request::Introduce {
                domid: 3,
                mfn: 1234,
                evtchn: 5,
            },
        ),
        (MsgType::Release, b"3\0", Request::Release { domid: 3 }),
        (
            MsgType::GetDomainPath,
            b"7\0",
            Request::GetDomainPath { domid: 7 },
        ),
        (
            MsgType::Write,
            b"/a\0hello",
            Request::Write {
                path: "/a",
                value: b"hello",
            },
        ),
        (
            MsgType::Write,
            b"/a\0",
            Request::Write {
                path: "/a",
                value: b"",
            },
        ),
        (
            MsgType::Write,
            b"/a\0x\0y",
            Request::Write {
                path: "/a",
                value: b"x\0y",
            },
        ),
        (MsgType::Mkdir, b"/a/b\0", Request::Mkdir { path: "/a/b" }),
        (MsgType::Rm, b"/a\0", Request::Rm { path: "/a" }),
        (
            MsgType::SetPerms,
            b"/a\0n0\0r5\0b6\0",
            Request::SetPerms {
                path: "/a",
                perms: Perms(vec![
                    Perm::new(PermKind::None, 0),
                    Perm::new(PermKind::Read, 5),
                    Perm::new(PermKind::Both, 6),
                ]),
            },
        ),
        (
            // The special nodes carry permissions (XSA-115).
            MsgType::SetPerms,
            b"@releaseDomain\0n0\0r5\0",
            Request::SetPerms {
                path: "@releaseDomain",
                perms: Perms(vec![
                    Perm::new(PermKind::None, 0),
                    Perm::new(PermKind::Read, 5),
                ]),
            },
        ),
        (
            MsgType::IsDomainIntroduced,
            b"4\0",
            Request::IsDomainIntroduced { domid: 4 },
        ),
        (MsgType::Resume, b"4\0", Request::Resume { domid: 4 }),
        (
            MsgType::SetTarget,
            b"4\05\0",
            Request::SetTarget {
                domid: 4,
                target: 5,
            },
        ),
        (MsgType::ResetWatches, b"\0", Request::ResetWatches),
        (
            MsgType::GetFeature,
            b"",
            Request::GetFeature { domid: None },
        ),
        (
            MsgType::GetFeature,
            b"2\0",
            Request::GetFeature { domid: Some(2) },
        ),
        (
            MsgType::SetFeature,
            b"2\01\0",
            Request::SetFeature {
                domid: 2,
                features: 1,
            },
        ),
        (
            MsgType::GetQuota,
            b"",
            Request::GetQuota {
                domid: None,
                quota: None,
            },
        ),
        (
            MsgType::GetQuota,
            b"nodes\0",
            Request::GetQuota {
                domid: None,
                quota: Some("nodes"),
            },
        ),
        (
            MsgType::GetQuota,
            b"3\0nodes\0",
            Request::GetQuota {
                domid: Some(3),
                quota: Some("nodes"),
            },
        ),
        (
            MsgType::SetQuota,
            b"nodes\0100\0",
            Request::SetQuota {
                domid: None,
                quota: "nodes",
                value: 100,
            },
        ),
        (
            MsgType::SetQuota,
            b"3\0nodes\0100\0",
            Request::SetQuota {
                domid: Some(3),
                quota: "nodes",
                value: 100,
            },
        ),
        (
            MsgType::Control,
            b"print\0hi\0",
            Request::Control {
                args: vec![b"print", b"hi"],
            },
        ),
    ];
    for (ty, bytes, want) in cases {
        let got = Request::parse(ty, bytes).unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(got, want, "{ty}");
        assert_eq!(got.msg_type(), ty);
        assert_eq!(got.to_payload(), bytes, "{ty} emit");
    }
}

#[test]
fn tolerated_request_variants_parse() {
    // Empty payloads for argument-less requests, and the reserved third watch string.
    assert_eq!(
        Request::parse(MsgType::TransactionStart, b"").unwrap(),
        Request::TransactionStart
    );
    assert_eq!(
        Request::parse(MsgType::ResetWatches, b"").unwrap(),
        Request::ResetWatches
    );
    assert_eq!(
        Request::parse(MsgType::Watch, b"/a\0t\0\0").unwrap(),
        Request::Watch {
            path: "/a",
            token: "t"
        }
    );
    assert_eq!(
        Request::parse(MsgType::Introduce, b"1\02\03\0\0").unwrap(),
        Request::Introduce {
            domid: 1,
            mfn: 2,
            evtchn: 3
        }
    );
}

#[test]
fn malformed_requests_are_typed_errors() {
    use WireError::*;
    let cases: Vec<(MsgType, &[u8], WireError)> = vec![
        (MsgType::Read, b"/a", Unterminated(MsgType::Read)),
        (
            MsgType::Read,
            b"",
            ArgCount {
                ty: MsgType::Read,
                got: 0,
                expected: "1",
            },
        ),
        (
            MsgType::Read,
            b"/a\0/b\0",
            ArgCount {
                ty: MsgType::Read,
                got: 2,
                expected: "1",
            },
        ),
        (MsgType::Read, b"\0", Path(PathError::Empty)),
        (MsgType::Read, b"/a//b\0", Path(PathError::DoubleSlash)),
        (MsgType::Read, b"/a/\0", Path(PathError::TrailingSlash)),
        (MsgType::Read, b"/a b\0", Path(PathError::BadChar(' '))),
        (
            MsgType::Read,
            b"@introduceDomain\0",
            Path(PathError::SpecialNotAllowed("@introduceDomain".into())),
        ),
        (MsgType::Read, b"/\xff\0", NotUtf8(MsgType::Read)),
        (MsgType::Write, b"/a", Unterminated(MsgType::Write)),
        (
            MsgType::Watch,
            b"/a\0",
            ArgCount {
                ty: MsgType::Watch,
                got: 1,
                expected: "2",
            },
        ),
        (
            MsgType::TransactionStart,
            b"x\0",
            ArgCount {
                ty: MsgType::TransactionStart,
                got: 1,
                expected: "0",
            },
        ),
        (
            MsgType::TransactionEnd,
            b"X\0",
            BadNumber {
                ty: MsgType::TransactionEnd,
                text: "X".into(),
            },
        ),
        (
            MsgType::GetDomainPath,
            b"-1\0",
            BadNumber {
                ty: MsgType::GetDomainPath,
                text: "-1".into(),
            },
        ),
        (
            MsgType::GetDomainPath,
            b"99999999999\0",
            BadNumber {
                ty: MsgType::GetDomainPath,
                text: "99999999999".into(),
            },
        ),
        (
            MsgType::SetPerms,
            b"/a\0",
            ArgCount {
                ty: MsgType::SetPerms,
                got: 1,
                expected: "at least 2",
            },
        ),
        (MsgType::SetPerms, b"/a\0x1\0", BadPerm("x1".into())),
        (MsgType::SetPerms, b"/a\0r70000\0", BadPerm("r70000".into())),
        (MsgType::SetPerms, b"/a\0r\0", BadPerm("r".into())),
        (
            MsgType::DirectoryPart,
            b"/a\0x\0",
            BadNumber {
                ty: MsgType::DirectoryPart,
                text: "x".into(),
            },
        ),
        (
            MsgType::SetQuota,
            b"nodes\0",
            ArgCount {
                ty: MsgType::SetQuota,
                got: 1,
                expected: "2 or 3",
            },
        ),
        (
            MsgType::WatchEvent,
            b"/a\0t\0",
            WrongDirection(MsgType::WatchEvent),
        ),
        (MsgType::Error, b"EINVAL\0", WrongDirection(MsgType::Error)),
    ];
    for (ty, bytes, want) in cases {
        assert_eq!(Request::parse(ty, bytes), Err(want), "{ty} {bytes:?}");
    }
}

#[test]
fn path_limits() {
    let abs = format!("/{}", "a".repeat(ABS_PATH_MAX - 1));
    assert_eq!(check_path(&abs), Ok(PathKind::Absolute));
    let abs_long = format!("{abs}b");
    assert_eq!(
        check_path(&abs_long),
        Err(PathError::TooLong {
            len: ABS_PATH_MAX + 1,
            max: ABS_PATH_MAX
        })
    );
    let rel = "a".repeat(REL_PATH_MAX);
    assert_eq!(check_path(&rel), Ok(PathKind::Relative));
    assert!(matches!(
        check_path(&format!("{rel}a")),
        Err(PathError::TooLong { .. })
    ));
    assert_eq!(check_path("/"), Ok(PathKind::Absolute));
    assert_eq!(check_watch_path("@releaseDomain"), Ok(PathKind::Special));
    assert_eq!(check_path("a-b_c@d/e1"), Ok(PathKind::Relative));
}

#[test]
fn responses_round_trip_from_literal_bytes() {
    let cases: Vec<(MsgType, &[u8], Response)> = vec![
        (MsgType::Write, b"OK\0", Response::Ok(MsgType::Write)),
        (MsgType::Watch, b"OK\0", Response::Ok(MsgType::Watch)),
        (MsgType::Read, b"value", Response::Read(b"value")),
        (MsgType::Read, b"", Response::Read(b"")),
        (
            MsgType::Directory,
            b"a\0bb\0",
            Response::Directory(vec!["a", "bb"]),
        ),
        (MsgType::Directory, b"", Response::Directory(vec![])),
        (
            MsgType::DirectoryPart,
            b"12\0a\0b\0",
            Response::DirectoryPart(DirectoryPart {
                generation: 12,
                children: vec!["a", "b"],
                complete: false,
            }),
        ),
        (
            MsgType::DirectoryPart,
            b"12\0c\0\0",
            Response::DirectoryPart(DirectoryPart {
                generation: 12,
                children: vec!["c"],
                complete: true,
            }),
        ),
        (
            MsgType::DirectoryPart,
            b"12\0\0",
            Response::DirectoryPart(DirectoryPart {
                generation: 12,
                children: vec![],
                complete: true,
            }),
        ),
        (
            MsgType::GetPerms,
            b"b1\0r0\0",
            Response::GetPerms(Perms(vec![
                Perm::new(PermKind::Both, 1),
                Perm::new(PermKind::Read, 0),
            ])),
        ),
        (
            MsgType::TransactionStart,
            b"42\0",
            Response::TransactionStart(42),
        ),
        (
            MsgType::GetDomainPath,
            b"/local/domain/3\0",
            Response::GetDomainPath("/local/domain/3"),
        ),
        (
            MsgType::IsDomainIntroduced,
            b"T\0",
            Response::IsDomainIntroduced(true),
        ),
        (
            MsgType::IsDomainIntroduced,
            b"F\0",
            Response::IsDomainIntroduced(false),
        ),
        (MsgType::GetFeature, b"3\0", Response::GetFeature(3)),
        (
            MsgType::GetQuota,
            b"17\0",
            Response::GetQuota(QuotaReply::Value(17)),
        ),
        (
            MsgType::GetQuota,
            b"nodes watches\0",
            Response::GetQuota(QuotaReply::Names(vec!["nodes", "watches"])),
        ),
        (
            MsgType::WatchEvent,
            b"/a/b\0tok\0",
            Response::WatchEvent {
                path: "/a/b",
                token: "tok",
            },
        ),
        (
            MsgType::Error,
            b"EAGAIN\0",
            Response::Error(XsErrno::EAGAIN),
        ),
        (
            MsgType::Control,
            b"help text",
            Response::Control(b"help text"),
        ),
    ];
    for (ty, bytes, want) in cases {
        let got = Response::parse(ty, bytes).unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(got, want, "{ty}");
        assert_eq!(got.msg_type(), ty);
        assert_eq!(got.to_payload(), bytes, "{ty} emit");
    }
}

#[test]
fn malformed_responses_are_typed_errors() {
    let expected_ok = Err(WireError::BadReply {
        ty: MsgType::Write,
        why: "expected OK",
    });
    assert_eq!(Response::parse(MsgType::Write, b"OK"), expected_ok);
    assert_eq!(Response::parse(MsgType::Write, b"NO\0"), expected_ok);
    assert_eq!(
        Response::parse(MsgType::Error, b"EWHAT\0"),
        Err(WireError::UnknownErrno("EWHAT".into()))
    );
    assert_eq!(
        Response::parse(MsgType::TransactionStart, b"x\0"),
        Err(WireError::BadNumber {
            ty: MsgType::TransactionStart,
            text: "x".into()
        })
    );
    assert_eq!(
        Response::parse(MsgType::DirectoryPart, b""),
        Err(WireError::BadReply {
            ty: MsgType::DirectoryPart,
            why: "no generation"
        })
    );
    assert_eq!(
        Response::parse(MsgType::DirectoryPart, b"1\0a\0\0\0"),
        Err(WireError::BadReply {
            ty: MsgType::DirectoryPart,
            why: "empty child name"
        })
    );
    assert_eq!(
        Response::parse(MsgType::GetPerms, b""),
        Err(WireError::BadReply {
            ty: MsgType::GetPerms,
            why: "no permissions"
        })
    );
    assert_eq!(
        Response::parse(MsgType::IsDomainIntroduced, b"Y\0"),
        Err(WireError::BadReply {
            ty: MsgType::IsDomainIntroduced,
            why: "expected T or F"
        })
    );
}

#[test]
fn errno_names_in_header_order() {
    let names: Vec<&str> = XsErrno::ALL.iter().map(|e| e.name()).collect();
    assert_eq!(
        names,
        [
            "EINVAL",
            "EACCES",
            "EEXIST",
            "EISDIR",
            "ENOENT",
            "ENOMEM",
            "ENOSPC",
            "EIO",
            "ENOTEMPTY",
            "ENOSYS",
            "EROFS",
            "EBUSY",
            "EAGAIN",
            "EISCONN",
            "E2BIG",
            "EPERM"
        ]
    );
    for e in XsErrno::ALL {
        assert_eq!(XsErrno::from_name(e.name()), Ok(e));
        assert_eq!(XsErrno::from_code(e.code()), Some(e));
    }
}

#[test]
fn frame_decoder_reassembles_split_and_joined_frames() {
    let a = Request::Read { path: "/a" }.to_frame(1, 0).unwrap();
    let b = Request::Write {
        path: "/b",
        value: b"v",
    }
    .to_frame(2, 3)
    .unwrap();
    let mut stream = a.clone();
    stream.extend_from_slice(&b);
    for split in 0..stream.len() {
        let mut dec = FrameDecoder::new();
        dec.push(&stream[..split]);
        let mut frames = Vec::new();
        while let Some(f) = dec.next_frame().unwrap() {
            frames.push(f);
        }
        dec.push(&stream[split..]);
        while let Some(f) = dec.next_frame().unwrap() {
            frames.push(f);
        }
        assert_eq!(frames, vec![a.clone(), b.clone()], "split at {split}");
        assert_eq!(dec.buffered(), 0);
    }
}

#[test]
fn frame_decoder_reports_oversized_as_soon_as_header_arrives() {
    let mut dec = FrameDecoder::new();
    let mut header = frame(11, 1, 0, b"");
    header[12..16].copy_from_slice(&5000u32.to_ne_bytes());
    dec.push(&header);
    assert_eq!(dec.next_frame(), Err(WireError::PayloadTooLong(5000)));
}

#[test]
fn encode_frame_refuses_oversized_payload() {
    assert_eq!(
        encode_frame(MsgType::Write, 1, 0, &[0u8; PAYLOAD_MAX + 1]),
        Err(WireError::PayloadTooLong(PAYLOAD_MAX + 1))
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn path_strategy() -> impl Strategy<Value = String> {
        prop::collection::vec("[a-zA-Z0-9_@-]{1,8}", 1..6).prop_map(|v| format!("/{}", v.join("/")))
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(ty in 0u32..30, payload in prop::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(ty) = MsgType::from_u32(ty) {
                let _ = Request::parse(ty, &payload);
                let _ = Response::parse(ty, &payload);
            }
            let mut dec = FrameDecoder::new();
            dec.push(&payload);
            while let Ok(Some(f)) = dec.next_frame() {
                let p = Packet::new_checked(&f[..]).unwrap();
                let _ = p.header();
            }
        }

        #[test]
        fn write_requests_round_trip(path in path_strategy(), value in prop::collection::vec(any::<u8>(), 0..200)) {
            let req = Request::Write { path: &path, value: &value };
            let frame = req.to_frame(9, 4).unwrap();
            let packet = Packet::new_checked(&frame[..]).unwrap();
            prop_assert_eq!(packet.req_id(), 9);
            prop_assert_eq!(packet.tx_id(), 4);
            let parsed = Request::parse(packet.msg_type().unwrap(), packet.payload()).unwrap();
            prop_assert_eq!(parsed, req);
        }

        #[test]
        fn directory_replies_round_trip(children in prop::collection::vec("[a-z0-9]{1,10}", 0..20)) {
            let names: Vec<&str> = children.iter().map(|s| s.as_str()).collect();
            let rsp = Response::Directory(names);
            let payload = rsp.to_payload();
            prop_assert_eq!(Response::parse(MsgType::Directory, &payload).unwrap(), rsp);
        }
    }
}
