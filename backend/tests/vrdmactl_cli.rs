//! `vrdmactl` against a simulated host with the real daemon running in dom0 (in-process, see
//! daemon_common): the nodes and permissions attach writes compared with libxl's
//! conventions, waiting for InitWait, detach etiquette, list, stats, and its error messages.

mod daemon_common;

use std::process::{Command, Output};

use daemon_common::*;
use shared_ring::abi::control::{access, Request, Status};
use xen_platform::DomId;
use xenstore_proto::client::NodeOps;

/// Runs `vrdmactl --sim <host> ARGS`.
fn ctl(s: &Stack, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vrdmactl"))
        .arg("--sim")
        .arg(s.host.dir())
        .args(args)
        .env_remove("VRDMA_SIM")
        .env_remove("RUST_LOG")
        .output()
        .expect("run vrdmactl")
}

fn ok(s: &Stack, args: &[&str]) -> String {
    let out = ctl(s, args);
    assert!(
        out.status.success(),
        "vrdmactl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Fails with exit status 1; returns stderr.
fn fails(s: &Stack, args: &[&str]) -> String {
    let out = ctl(s, args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "vrdmactl {args:?} should fail; stdout {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

fn perms(s: &Stack, path: &str) -> Vec<String> {
    s.dom0
        .get_perms(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .0
        .iter()
        .map(|p| p.to_string())
        .collect()
}

fn read(s: &Stack, path: &str) -> Option<String> {
    s.dom0
        .read_opt(path)
        .unwrap()
        .map(|v| String::from_utf8(v).unwrap())
}

/// Every path of a device's nodes, as they must not outlive a detach.
fn device_nodes(d: u32) -> Vec<String> {
    vec![
        format!("/local/domain/0/backend/vrdma/{d}/0"),
        format!("/local/domain/0/backend/vrdma/{d}"),
        format!("/local/domain/{d}/device/vrdma/0"),
        format!("/local/domain/{d}/device/vrdma"),
        format!("/libxl/{d}/device/vrdma/0"),
    ]
}

#[test]
fn attach_writes_libxls_nodes_and_permissions_and_waits_for_init_wait() {
    let s = Stack::start();
    let d = s.new_domain();
    let out = ok(
        &s,
        &["attach", &d.to_string(), "--max-qps", "4", "--max-mrs", "9"],
    );
    assert!(out.contains("InitWait"), "{out}");
    // vrdmactl returned after InitWait, so the backend's answer is already there.
    assert_eq!(read(&s, &s.backend_node(d, "state")).as_deref(), Some("2"));

    let be = format!("/local/domain/0/backend/vrdma/{d}/0");
    let fe = format!("/local/domain/{d}/device/vrdma/0");
    let rec = format!("/libxl/{d}/device/vrdma/0");
    let (own_be, own_fe, dom0_only) = (
        vec!["n0".to_owned(), format!("r{d}")],
        vec![format!("n{d}"), "r0".to_owned()],
        vec!["n0".to_owned()],
    );
    // libxl__device_generic_add: each directory owned by its side with the other reading,
    // every key inside inheriting that; libxl's record readable by dom0 only.
    let expected: Vec<(String, Option<String>, Vec<String>)> = vec![
        (be.clone(), None, own_be.clone()),
        (format!("{be}/frontend"), Some(fe.clone()), own_be.clone()),
        (
            format!("{be}/frontend-id"),
            Some(d.to_string()),
            own_be.clone(),
        ),
        (format!("{be}/online"), Some("1".into()), own_be.clone()),
        (format!("{be}/max-qps"), Some("4".into()), own_be.clone()),
        (format!("{be}/max-mrs"), Some("9".into()), own_be.clone()),
        (fe.clone(), None, own_fe.clone()),
        (format!("{fe}/backend"), Some(be.clone()), own_fe.clone()),
        (format!("{fe}/backend-id"), Some("0".into()), own_fe.clone()),
        (format!("{fe}/state"), Some("1".into()), own_fe.clone()),
        (rec.clone(), None, dom0_only.clone()),
        (
            format!("{rec}/frontend"),
            Some(fe.clone()),
            dom0_only.clone(),
        ),
        (
            format!("{rec}/backend"),
            Some(be.clone()),
            dom0_only.clone(),
        ),
    ];
    for (path, value, want) in &expected {
        assert_eq!(&perms(&s, path), want, "permissions of {path}");
        if let Some(v) = value {
            assert_eq!(read(&s, path).as_ref(), Some(v), "value of {path}");
        }
    }
    // The backend's own answer keeps the directory's permissions.
    assert_eq!(perms(&s, &format!("{be}/state")), own_be);
    // Quotas not given are not written: the daemon's configured defaults apply.
    assert_eq!(read(&s, &format!("{be}/max-cqs")), None);

    // What those permissions mean to the guest: it reads its quotas, cannot raise them,
    // cannot see libxl's record, and owns its own directory.
    let guest = platform(s.host.dir(), DomId(d as u16)).xenstore().unwrap();
    assert_eq!(guest.read_string(&format!("{be}/max-qps")).unwrap(), "4");
    assert!(guest
        .write(&format!("{be}/max-qps"), "1000")
        .unwrap_err()
        .is_access_denied());
    assert!(guest
        .read(&format!("{rec}/backend"))
        .unwrap_err()
        .is_access_denied());
    guest.write(&format!("{fe}/scratch"), "x").unwrap();
}

#[test]
fn attach_without_a_backend_times_out_clearly_and_no_wait_leaves_it_for_a_later_backend() {
    let mut s = Stack::start();
    s.stop_daemon();
    let d = s.new_domain();
    let err = fails(&s, &["attach", &d.to_string(), "--timeout", "0.3"]);
    assert!(err.contains("no backend answered"), "{err}");
    assert!(err.contains("is vrdma-backend running"), "{err}");
    assert!(err.contains("nodes were removed"), "{err}");
    for p in device_nodes(d) {
        assert!(!s.dom0.exists(&p).unwrap(), "{p} left behind");
    }

    let out = ok(&s, &["attach", &d.to_string(), "--no-wait"]);
    assert!(out.contains("not waiting"), "{out}");
    assert_eq!(read(&s, &s.backend_node(d, "state")).as_deref(), Some("1"));
    let listed = ok(&s, &["list"]);
    assert!(listed.contains("Initialising"), "{listed}");
    s.start_daemon();
    wait_value(&*s.dom0, &s.backend_node(d, "state"), "2");
}

#[test]
fn cli_errors_name_the_problem() {
    let s = Stack::start();
    let err = fails(&s, &["attach", "77"]);
    assert!(err.contains("domain 77 does not exist"), "{err}");
    let err = fails(&s, &["detach", "77"]);
    assert!(err.contains("domain 77 does not exist"), "{err}");
    let err = fails(&s, &["stats", "77"]);
    assert!(err.contains("domain 77 does not exist"), "{err}");
    let err = fails(&s, &["attach", "0"]);
    assert!(err.contains("its own vrdma backend"), "{err}");

    let d = s.new_domain();
    let err = fails(&s, &["detach", &d.to_string()]);
    assert!(
        err.contains(&format!("domain {d} has no vrdma device 0")),
        "{err}"
    );
    let err = fails(&s, &["stats", &d.to_string()]);
    assert!(err.contains("has no vrdma device"), "{err}");
    ok(&s, &["attach", &d.to_string()]);
    let err = fails(&s, &["attach", &d.to_string()]);
    assert!(err.contains("already attached"), "{err}");
    // A second device id is another device.
    ok(&s, &["attach", &d.to_string(), "--devid", "1"]);
    let listed = ok(&s, &["list", &d.to_string(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{listed}");
    ok(&s, &["detach", &d.to_string(), "--all"]);
    assert_eq!(ok(&s, &["list"]).trim(), "no vrdma devices");
}

/// Stops the daemon and leaves the device as a hung backend would: InitWait, never Closed.
fn hang_backend(s: &mut Stack, d: u32) {
    s.stop_daemon();
    assert_eq!(read(s, &s.backend_node(d, "state")).as_deref(), Some("6"));
    s.dom0.write(&s.backend_node(d, "state"), "2").unwrap();
}

#[test]
fn detach_follows_closing_closed_and_removes_everything() {
    let mut s = Stack::start();
    let d = s.new_domain();
    ok(&s, &["attach", &d.to_string()]);

    // A backend that hangs (stopped after InitWait; a stopping daemon would mark the device
    // Closed, so InitWait is put back): the toolstack's half of the etiquette is visible,
    // online 0 and state Closing, and the nodes stay when Closed does not come.
    hang_backend(&mut s, d);
    let err = fails(&s, &["detach", &d.to_string(), "--timeout", "0.3"]);
    assert!(err.contains("did not close"), "{err}");
    assert!(err.contains("--force"), "{err}");
    assert_eq!(read(&s, &s.backend_node(d, "online")).as_deref(), Some("0"));
    assert_eq!(read(&s, &s.backend_node(d, "state")).as_deref(), Some("5"));

    // A backend that starts finishes the detach (Closed), and detach then removes it all
    // without writing Closing over Closed again.
    s.start_daemon();
    wait_value(&*s.dom0, &s.backend_node(d, "state"), "6");
    let out = ok(&s, &["detach", &d.to_string()]);
    assert!(out.contains("detached"), "{out}");
    for p in device_nodes(d) {
        assert!(!s.dom0.exists(&p).unwrap(), "{p} left behind");
    }
    assert!(!s.dom0.exists(&format!("/libxl/{d}")).unwrap());
    // The guest's own tree is untouched.
    assert!(s.dom0.exists(&format!("/local/domain/{d}/device")).unwrap());

    // --force removes a device whose backend never answers.
    ok(&s, &["attach", &d.to_string()]);
    hang_backend(&mut s, d);
    let out = ok(
        &s,
        &["detach", &d.to_string(), "--timeout", "0.3", "--force"],
    );
    assert!(out.contains("did not answer Closed"), "{out}");
    for p in device_nodes(d) {
        assert!(!s.dom0.exists(&p).unwrap(), "{p} left behind");
    }
}

#[test]
fn detach_closes_a_live_channel_and_a_gone_domain_is_cleaned_up() {
    let s = Stack::start();
    let d = s.new_domain();
    ok(&s, &["attach", &d.to_string()]);
    let (mut fe, st) = Frontend::open(s.host.dir(), d, 0);
    assert_eq!(st, "4");
    assert_eq!(fe.call(Request::Init { version: 2 }).status, Status::Ok);
    wait_value(&*s.dom0, &s.stats_node(d, "channels"), "1");
    let out = ok(&s, &["detach", &d.to_string()]);
    // "detached" (not "removed"): the backend closed the channel and answered Closed.
    assert!(out.starts_with("detached"), "{out}");
    assert!(!s.dom0.exists(&s.backend_node(d, "state")).unwrap());
    drop(fe);

    // A domain destroyed with its device attached: the backend's nodes stay (they are the
    // toolstack's to remove), list says the domain is gone, detach cleans up.
    let d2 = s.new_domain();
    ok(&s, &["attach", &d2.to_string()]);
    s.host.destroy_domain(DomId(d2 as u16)).unwrap();
    wait_for(&*s.dom0, &format!("/local/domain/{d2}"), |v| v.is_none());
    let listed = ok(&s, &["list"]);
    assert!(listed.contains("(domain gone)"), "{listed}");
    ok(&s, &["detach", &d2.to_string(), "--all"]);
    for p in device_nodes(d2) {
        assert!(!s.dom0.exists(&p).unwrap(), "{p} left behind");
    }
}

#[test]
fn list_and_stats_show_channels_and_resources_then_zero() {
    let s = Stack::start();
    let d = s.new_domain();
    ok(&s, &["attach", &d.to_string(), "--max-pds", "3"]);
    let (mut fe, st) = Frontend::open(s.host.dir(), d, 0);
    assert_eq!(st, "4");
    assert_eq!(fe.call(Request::Init { version: 2 }).status, Status::Ok);
    let pd = fe.alloc_pd();
    let (mem, r) = fe.reg_inline_mr(pd, 2);
    assert_eq!(r.status, Status::Ok, "{r:?}");
    // A refused request is an error the device counts.
    assert_ne!(
        fe.call(Request::DeallocPd { pd: pd + 1000 }).status,
        Status::Ok
    );
    wait_value(&*s.dom0, &s.stats_node(d, "mr-pages"), "2");
    wait_value(&*s.dom0, &s.stats_node(d, "pds"), "1");

    let listed: serde_json::Value = serde_json::from_str(&ok(&s, &["list", "--json"])).unwrap();
    let dev = &listed[0];
    assert_eq!(dev["domid"], d);
    // InitWait, or Connected once a frontend sets the device Connected (this one does not).
    assert_eq!(dev["backend_state"], 2, "{dev}");
    assert_eq!(dev["quotas"]["max-pds"], 3);
    assert_eq!(dev["kind"], "soft-iwarp");
    let ch = &dev["channels"][0];
    assert_eq!(ch["channel"], 0);
    assert_eq!(ch["backend_state"], 4);
    assert_eq!(ch["pid"], std::process::id());
    let table = ok(&s, &["list"]);
    assert!(table.contains("channel 0"), "{table}");
    assert!(table.contains("Connected"), "{table}");

    let stats: serde_json::Value =
        serde_json::from_str(&ok(&s, &["stats", &d.to_string(), "--json"])).unwrap();
    let c = &stats[0]["counters"];
    assert_eq!(c["channels"], 1, "{stats}");
    assert_eq!(c["pds"], 1);
    assert_eq!(c["mrs"], 1);
    assert_eq!(c["mr-pages"], 2);
    assert_eq!(c["qps"], 0);
    for k in ["ops", "bytes", "errors", "notifications", "events"] {
        assert!(c[k].is_u64(), "{k} missing: {stats}");
    }
    let table = ok(&s, &["stats"]);
    assert!(table.contains(&format!("domain {d} device 0")), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().eq(["mr-pages", "2"])),
        "{table}"
    );

    // The process goes: everything it held is reclaimed and the counters say so.
    drop(mem);
    drop(fe);
    wait_value(&*s.dom0, &s.stats_node(d, "channels"), "0");
    wait_value(&*s.dom0, &s.stats_node(d, "mr-pages"), "0");
    let stats: serde_json::Value = serde_json::from_str(&ok(&s, &["stats", "--json"])).unwrap();
    for k in ["channels", "pds", "mrs", "mr-pages", "cqs", "qps"] {
        assert_eq!(stats[0]["counters"][k], 0, "{k}: {stats}");
    }

    // Detach and attach again: a fresh device holds nothing.
    ok(&s, &["detach", &d.to_string()]);
    let err = fails(&s, &["stats", &d.to_string()]);
    assert!(err.contains("has no vrdma device"), "{err}");
    ok(&s, &["attach", &d.to_string()]);
    wait_value(&*s.dom0, &s.stats_node(d, "channels"), "0");
    let stats: serde_json::Value = serde_json::from_str(&ok(&s, &["stats", "--json"])).unwrap();
    for k in ["channels", "pds", "mrs", "mr-pages", "cqs", "qps"] {
        assert_eq!(stats[0]["counters"][k], 0, "{k}: {stats}");
    }
}

#[test]
fn stats_shows_per_qp_counters_until_the_qps_go() {
    use shared_ring::abi::cqe::CqeStatus;
    use shared_ring::abi::wqe::WqeOpcode;
    use vrdma_backend::device::testkit::{connect, wqe, TestChannel};
    use vrdma_backend::device::ChannelMode;

    let s = Stack::start();
    let d = s.new_domain();
    ok(&s, &["attach", &d.to_string()]);
    wait_value(&*s.dom0, &s.backend_node(d, "state"), "2");
    // Two channels of domain d on the daemon's device, played in-process (testkit): a QP pair
    // with a SEND of 100 bytes and an RDMA WRITE of 4096 bytes from a to b.
    let dev = &*s.device;
    let mut a = TestChannel::open(dev, d as u16, ChannelMode::Bypass);
    let mut b = TestChannel::open(dev, d as u16, ChannelMode::Bypass);
    let (mut acq, mut bcq) = (a.cq(dev, 6), b.cq(dev, 6));
    let mut aqp = a.qp(dev, &acq, &acq, 4);
    let mut bqp = b.qp(dev, &bcq, &bcq, 4);
    connect(dev, &aqp, &bqp);
    let src = a.mr(dev, 8192, access::ALL);
    let dst = b.mr(dev, 8192, access::ALL);
    bqp.post_recv(dev, 1, &[dst.sge(0, 4096)]);
    aqp.post_send(dev, &wqe(WqeOpcode::Send, 1, &[src.sge(0, 100)], (0, 0), 0));
    let w = wqe(
        WqeOpcode::RdmaWrite,
        2,
        &[src.sge(0, 4096)],
        (dst.iova, dst.keys.rkey),
        0,
    );
    aqp.post_send(dev, &w);
    for _ in 0..2 {
        assert_eq!(acq.wait(dev).status, CqeStatus::Success);
    }
    assert_eq!(bcq.wait(dev).status, CqeStatus::Success);

    // The daemon publishes them on its next stats round.
    let (an, bn) = (aqp.num.0, bqp.num.0);
    wait_value(&*s.dom0, &s.stats_node(d, &format!("qp/{bn}/bytes")), "100");
    wait_value(
        &*s.dom0,
        &s.stats_node(d, &format!("qp/{an}/bytes")),
        "4196",
    );
    let stats: serde_json::Value =
        serde_json::from_str(&ok(&s, &["stats", &d.to_string(), "--json"])).unwrap();
    let qps = &stats[0]["groups"]["qp"];
    let (qa, qb) = (&qps[an.to_string()], &qps[bn.to_string()]);
    assert_eq!(
        (
            &qa["ops"],
            &qa["bytes"],
            &qa["errors"],
            &qa["recvs"],
            &qa["state"]
        ),
        (
            &serde_json::json!(2),
            &serde_json::json!(4196),
            &serde_json::json!(0),
            &serde_json::json!(0),
            &serde_json::json!("rts")
        ),
        "{stats}"
    );
    assert_eq!(
        (&qb["ops"], &qb["bytes"], &qb["errors"], &qb["recvs"]),
        (
            &serde_json::json!(1),
            &serde_json::json!(100),
            &serde_json::json!(0),
            &serde_json::json!(1)
        ),
        "{stats}"
    );
    let table = ok(&s, &["stats", &d.to_string()]);
    let header = table
        .lines()
        .find(|l| l.trim_start().starts_with("qp "))
        .unwrap_or_else(|| panic!("no qp table: {table}"));
    let cols: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        cols,
        ["qp", "state", "ops", "bytes", "errors", "recvs"],
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&an.to_string()))
        .unwrap_or_else(|| panic!("no row for QP {an}: {table}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[1..], ["rts", "2", "4196", "0", "0"], "{table}");

    // Destroying a QP removes its directory; its peer goes to Error.
    dev.destroy_qp(b.id, bqp.num).unwrap();
    wait_for(&*s.dom0, &s.stats_node(d, &format!("qp/{bn}")), |v| {
        v.is_none()
    });
    wait_value(
        &*s.dom0,
        &s.stats_node(d, &format!("qp/{an}/state")),
        "error",
    );
    // Closing the last channel (what reclaim does when the process dies) leaves nothing.
    dev.close_channel(a.id);
    dev.close_channel(b.id);
    wait_for(&*s.dom0, &s.stats_node(d, "qp"), |v| v.is_none());
    let stats: serde_json::Value =
        serde_json::from_str(&ok(&s, &["stats", &d.to_string(), "--json"])).unwrap();
    assert!(stats[0]["groups"].get("qp").is_none(), "{stats}");
}
