//! Unmodified verbs programs between guests of TWO simulated hosts (issue 14): each host its
//! own hypervisor, XenStore and vrdma backend (`vrdma_demo::lab::Lab::start_host`, in this
//! process), host A's backend at 127.0.0.2 and host B's at 127.0.0.3, a guest on each; the
//! programs connect through librdmacm (this library's `rdma_cm`) and the backends carry the
//! QPs over iWARP (MPA/DDP/RDMAP over TCP between the two loopback addresses).
//!
//! - Debian's `rping -v -V -C 10`, server in the guest of A and client in the guest of B,
//!   and the reverse: both print the 10 ping strings rping's client generates, exactly (the
//!   server RDMA-READs each from the client and RDMA-WRITEs it back, the client checks it);
//! - Debian's perftest `ib_{send,write,read}_{lat,bw} -R` (rdma_cm), server on A, client on
//!   B: both ends finish, use rdma_cm, name each other's QP and print their result rows;
//!   and each of the six with `-a` (every size up to 8 MiB).
//!
//! Needs `rdmacm-utils` and `perftest`; without them the tests fail saying what to install,
//! unless `VRDMA_SKIP_VERBS_TOOLS=1`.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use vrdma_demo::lab::Lab;
use xen_platform::DomId;

mod common;
use common::{
    exec_in, free_port_on, have, perftest_qpns, result_rows, rping_client_then_check,
    wait_listening,
};

const HOST_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const HOST_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// Two simulated hosts with a guest each.
struct TwoHosts {
    a: Lab,
    b: Lab,
    ga: DomId,
    gb: DomId,
}

impl TwoHosts {
    fn start(tag: &str) -> TwoHosts {
        let mut a = Lab::start_host(None, "A", Some(HOST_A.into())).expect("start host A");
        let mut b = Lab::start_host(None, "B", Some(HOST_B.into())).expect("start host B");
        assert!(
            a.address_in_config && b.address_in_config,
            "the backends did not take their addresses"
        );
        let ga = a.create_guest(&format!("{tag}-a")).expect("guest on A");
        let gb = b.create_guest(&format!("{tag}-b")).expect("guest on B");
        TwoHosts { a, b, ga, gb }
    }

    /// (server's lab, server's guest, server's host address, client's lab, client's guest).
    fn roles(&self, server_on_a: bool) -> (&Lab, DomId, Ipv4Addr, &Lab, DomId) {
        if server_on_a {
            (&self.a, self.ga, HOST_A, &self.b, self.gb)
        } else {
            (&self.b, self.gb, HOST_B, &self.a, self.ga)
        }
    }
}

/// Debian's `rping` between the guest of A and the guest of B (server on A if `server_on_a`).
fn rping_across(server_on_a: bool) {
    if !have("rping", "rdmacm-utils") {
        return;
    }
    let hosts = TwoHosts::start("rping");
    let (sl, sg, saddr, cl, cg) = hosts.roles(server_on_a);
    let port = free_port_on(saddr).to_string();
    let addr = saddr.to_string();
    let count = 10;
    let count_s = count.to_string();
    let mut server = exec_in(
        sl,
        sg,
        &[
            "rping", "-s", "-v", "-C", &count_s, "-a", &addr, "-p", &port,
        ],
    );
    let client_args = [
        "rping", "-c", "-v", "-V", "-C", &count_s, "-a", &addr, "-p", &port,
    ];
    // Until the server listens, a connect finds nobody: try again, a bounded number of times.
    rping_client_then_check(&mut server, count, || exec_in(cl, cg, &client_args));
}

#[test]
fn rping_server_on_host_a_client_on_host_b() {
    rping_across(true);
}

#[test]
fn rping_server_on_host_b_client_on_host_a() {
    rping_across(false);
}

/// perftest's spelling of the GID of an IPv4 address (`::ffff:a.b.c.d`, decimal bytes).
fn gid_of(a: Ipv4Addr) -> String {
    let [w, x, y, z] = a.octets();
    format!("00:00:00:00:00:00:00:00:00:00:255:255:{w:02}:{x:02}:{y:02}:{z:02}")
}

/// The GIDs perftest prints under its `local address:` and `remote address:` lines.
fn perftest_gids(out: &str) -> (Option<String>, Option<String>) {
    let find = |tag: &str| {
        let mut lines = out.lines().skip_while(|l| !l.trim_start().starts_with(tag));
        lines.next()?;
        let g = lines.next()?.trim().strip_prefix("GID:")?;
        Some(g.trim().to_string())
    };
    (find("local address:"), find("remote address:"))
}

/// Debian's perftest `tool -R` (rdma_cm) with `extra`, server in the guest of A, client in
/// the guest of B, connecting to A's address.
fn perftest_across(tool: &str, extra: &[&str]) {
    if !have(tool, "perftest") {
        return;
    }
    let started = Instant::now();
    let hosts = TwoHosts::start("perftest");
    let (sl, sg, saddr, cl, cg) = hosts.roles(true);
    let all = extra.contains(&"-a");
    let iters = if all { "5" } else { "50" };
    let addr = saddr.to_string();
    let mut earlier = String::new();
    // perftest -R connects twice (its own exchange, then the test QPs); a client whose first
    // connect comes before the server listens is rejected: try the client again. A client
    // whose second connect comes too early fails for good ("Failed to connect RDMA CM
    // events", perftest's retry reuses destroyed ids): start a new pair.
    for round in 1..=5 {
        let port = free_port_on(saddr).to_string();
        // `-F`: perftest's cycle calibration can fail under load, and the tool then exits 1
        // after its test ("Can't produce a report") unless `-F`.
        let mut common = vec![tool, "-R", "-F", "-p", &port, "-n", iters];
        common.extend_from_slice(extra);
        let mut server = exec_in(sl, sg, &common);
        let mut client_args = common.clone();
        client_args.push(&addr);
        let mut done = None;
        for attempt in 1..=20 {
            let (cok, cout, cerr) = exec_in(cl, cg, &client_args).finish(Duration::from_secs(240));
            if cok {
                done = Some((cout, cerr));
                break;
            }
            earlier.push_str(&format!(
                "round {round} attempt {attempt}:\n{cout}\n{cerr}\n"
            ));
            if cerr.contains("Failed to connect RDMA CM events") || !cout.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let Some((cout, cerr)) = done else {
            let (_, sout, serr) = server.finish(Duration::from_secs(5));
            earlier.push_str(&format!("round {round} server:\n{sout}\n{serr}\n"));
            continue;
        };
        let (sok, sout, serr) = server.finish(Duration::from_secs(60));
        assert!(
            sok,
            "{tool} -R server failed\n--- server:\n{sout}\n{serr}\n--- client:\n{cout}\n{cerr}"
        );
        let (cl_qpn, cr_qpn) = perftest_qpns(&cout);
        let (sl_qpn, sr_qpn) = perftest_qpns(&sout);
        assert!(
            cl_qpn.is_some() && cl_qpn == sr_qpn && sl_qpn.is_some() && sl_qpn == cr_qpn,
            "the ends do not name each other's QP:\n{cout}\n{sout}"
        );
        for (who, out) in [("client", &cout), ("server", &sout)] {
            assert!(
                out.contains("Data ex. method : rdma_cm"),
                "{who} did not use rdma_cm:\n{out}"
            );
            // The device reports RoCE (transport IB, link layer Ethernet; docs/verbs.md),
            // its GID the backend's address: each end names its own host and the other.
            let (mine, theirs) = if who == "client" {
                (HOST_B, HOST_A)
            } else {
                (HOST_A, HOST_B)
            };
            assert!(
                out.contains("Transport type : IB") && out.contains("Link type       : Ethernet"),
                "{who}: not the device's RoCE-style report:\n{out}"
            );
            assert_eq!(
                perftest_gids(out),
                (Some(gid_of(mine)), Some(gid_of(theirs))),
                "{who}: GIDs do not name the two hosts:\n{out}"
            );
            if who == "server" && tool == "ib_read_lat" {
                continue; // passive: the server of a read test prints no figures
            }
            let rows = result_rows(out);
            assert!(
                !rows.is_empty()
                    && rows
                        .iter()
                        .all(|r| r.split_whitespace().nth(1) == Some(iters)),
                "{who} printed no result rows for {iters} iterations:\n{out}"
            );
            if all {
                assert!(
                    rows.last()
                        .is_some_and(|r| r.trim_start().starts_with("8388608 ")),
                    "{who} did not reach 8 MiB:\n{out}"
                );
            }
        }
        eprintln!(
            "{tool} -R {extra:?} across two hosts: {:.1} s (round {round}); client's rows:\n{}",
            started.elapsed().as_secs_f64(),
            result_rows(&cout).join("\n")
        );
        return;
    }
    panic!("{tool} -R did not connect across two hosts in 5 rounds:\n{earlier}");
}

#[test]
fn perftest_send_lat_across_hosts() {
    perftest_across("ib_send_lat", &[]);
}

#[test]
fn perftest_write_lat_across_hosts() {
    perftest_across("ib_write_lat", &[]);
}

#[test]
fn perftest_read_lat_across_hosts() {
    perftest_across("ib_read_lat", &[]);
}

#[test]
fn perftest_send_bw_across_hosts() {
    perftest_across("ib_send_bw", &[]);
}

#[test]
fn perftest_write_bw_across_hosts() {
    perftest_across("ib_write_bw", &[]);
}

#[test]
fn perftest_read_bw_across_hosts() {
    perftest_across("ib_read_bw", &[]);
}

/// `-a`: every size from 2 B to 8 MiB, 5 iterations each. The latency tools take 25–35 s
/// each here, none of it waiting in the data path: perftest calibrates the CPU clock twice
/// per size (`get_cpu_mhz`, 219 ms of busy-waiting each: 10.1 s per run on any device,
/// stretched on a loaded 2-core machine), and each message hop may wait for a 4 ms scheduler
/// tick while both ends busy-poll (docs/benchmarks.md, "Perftest's latency tools with `-a`
/// across hosts").
#[test]
fn perftest_send_lat_all_sizes_across_hosts() {
    perftest_across("ib_send_lat", &["-a"]);
}

#[test]
fn perftest_write_lat_all_sizes_across_hosts() {
    perftest_across("ib_write_lat", &["-a"]);
}

#[test]
fn perftest_read_lat_all_sizes_across_hosts() {
    perftest_across("ib_read_lat", &["-a"]);
}

#[test]
fn perftest_send_bw_all_sizes_across_hosts() {
    perftest_across("ib_send_bw", &["-a"]);
}

#[test]
fn perftest_write_bw_all_sizes_across_hosts() {
    perftest_across("ib_write_bw", &["-a"]);
}

#[test]
fn perftest_read_bw_all_sizes_across_hosts() {
    perftest_across("ib_read_bw", &["-a"]);
}

/// Debian's `ibv_rc_pingpong -g 0` (address vectors, no rdma_cm) between the guest of A and
/// the guest of B: the backend pairs QPs by number on its own host only, so the address
/// vector to the other host's GID is refused at once — `ibv_modify_qp` to RTR fails with
/// EOPNOTSUPP, the tools stop there — instead of a later `ibv_post_send` failing
/// after the backend refused the connect in the background.
#[test]
fn ibv_rc_pingpong_across_hosts_is_refused_at_rtr() {
    if !have("ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let hosts = TwoHosts::start("pp");
    let (sl, sg, saddr, cl, cg) = hosts.roles(true);
    let port = free_port_on(Ipv4Addr::UNSPECIFIED).to_string();
    let common = ["ibv_rc_pingpong", "-g", "0", "-p", &port, "-n", "10"];
    let mut server = exec_in(sl, sg, &common);
    wait_listening(&port, &mut server, "ibv_rc_pingpong");
    let addr = saddr.to_string();
    let mut client_args = common.to_vec();
    client_args.push(&addr);
    let (cok, cout, cerr) = exec_in(cl, cg, &client_args).finish(Duration::from_secs(120));
    let (sok, sout, serr) = server.finish(Duration::from_secs(60));
    let all = format!("--- client:\n{cout}\n{cerr}\n--- server:\n{sout}\n{serr}");
    assert!(!cok && !sok, "both ends must fail:\n{all}");
    // Each end's GID is its backend's address; the server, which moves its QP to RTR first
    // (with the client's GID), is refused there and hangs up, so the client never gets to.
    assert!(
        sout.contains("GID ::ffff:127.0.0.2") && cout.contains("GID ::ffff:127.0.0.3"),
        "{all}"
    );
    assert!(
        serr.contains("Couldn't connect to remote QP"),
        "the server must fail at RTR:\n{all}"
    );
    assert!(
        !cerr.contains("Couldn't post send") && !serr.contains("Couldn't post send"),
        "{all}"
    );
}
