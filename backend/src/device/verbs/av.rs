//! Address vectors of a guest's RTR (`ConnectAv`): which of the port's GIDs is the source
//! and which path MTU the QP uses. Pure functions over the port's GID table (tested without
//! a device).

use super::abi::{ibv_gid, IBV_GID_TYPE_ROCE_V2, IBV_MTU_256, IBV_MTU_4096};
use super::probe::PortAv;
use super::PortGid;
use crate::device::RemoteAv;

/// Whether a GID is an IPv4-mapped IPv6 address (RoCE v2 of an IPv4 address).
fn v4_mapped(g: &[u8; 16]) -> bool {
    g[..10] == [0; 10] && g[10..12] == [0xff, 0xff]
}

fn link_local(g: &[u8; 16]) -> bool {
    g[0] == 0xfe && g[1] & 0xc0 == 0x80
}

/// The entries of a RoCE port's GID table a QP may send from: its RoCE v2 ones when it has
/// any (mlx4/mlx5 list every address twice, as RoCE v1 and v2; v1 is layer-2 only and not
/// what a peer on another subnet, or rxe, speaks), else every entry (a port of RoCE v1 only,
/// or types not readable). Entries of unknown type stay beside the v2 ones.
pub(crate) fn sendable(gids: &[PortGid]) -> Vec<PortGid> {
    if gids.iter().any(|g| g.ty == Some(IBV_GID_TYPE_ROCE_V2)) {
        gids.iter()
            .copied()
            .filter(|g| g.ty.is_none() || g.ty == Some(IBV_GID_TYPE_ROCE_V2))
            .collect()
    } else {
        gids.to_vec()
    }
}

/// The port's own GID among its [`sendable`] entries `gids` (what [`super::probe::port_av`]
/// picks when no index is configured): an IPv4-mapped one first (RoCE v2 of the port's IPv4
/// address, what rdma_cm and the backend's published `address` use), else a global IPv6
/// one, else the first (the port's default link-local GID, which every RoCE port has at
/// index 0 and which routes only on its own layer-2 segment).
pub(crate) fn own_gid(gids: &[PortGid]) -> Option<&PortGid> {
    gids.iter()
        .find(|g| v4_mapped(&g.gid))
        .or_else(|| gids.iter().find(|g| !link_local(&g.gid)))
        .or_else(|| gids.first())
}

/// The GID table the guests see (`QueryGid`): the port's non-zero entries `table` with
/// their types (ibverbs' numbering, which the control ABI shares; an unreadable type on
/// RoCE is taken for v2), led by the backend's published address (`address`, as the RoCE v2
/// GID it is on this port) when the table holds it, else by the port's own GID (`own`, the
/// index [`super::probe::port_av`] picked), so that the guest's GID 0 is the address the
/// guest library and rdma_cm already use; the others after it in the port's order; at most
/// `MAX_GIDS`.
pub(crate) fn guest_table(
    table: &[PortGid],
    own: Option<i32>,
    address: Option<std::net::IpAddr>,
) -> Vec<([u8; 16], u32)> {
    let entry = |g: &PortGid| (g.gid, g.ty.unwrap_or(IBV_GID_TYPE_ROCE_V2));
    let published = address.map(|a| match a {
        std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(a) => a.octets(),
    });
    let first = published
        .and_then(|p| {
            sendable(table)
                .into_iter()
                .find(|g| g.gid == p)
                .map(|g| g.index)
        })
        .or(own);
    table
        .iter()
        .filter(|g| Some(g.index) == first)
        .chain(table.iter().filter(|g| Some(g.index) != first))
        .map(entry)
        .take(shared_ring::abi::control::MAX_GIDS as usize)
        .collect()
}

/// The address vector towards `remote` from the port `base` describes, whose GID table holds
/// the non-zero entries `gids` and whose active MTU is `active_mtu`. Only [`sendable`]
/// entries are picked (RoCE v2 when the port has them).
///
/// - RoCE (`base` has a GID): the peer must have one; the source GID is of the same kind as
///   the peer's — an IPv4-mapped GID for an IPv4-mapped peer (RoCE v2 over IPv4; `base`'s
///   own GID first if it is one), else a GID that is not (IPv6; a link-local one for a
///   link-local peer if the port has one) — so the device builds the packet of the peer's
///   family. InfiniBand (`base` has none): the peer is its LID; a GID means a global route
///   from GID index 0.
/// - Path MTU: the guest's (1..=5, `IBV_MTU_256`..`IBV_MTU_4096`) bounded by the port's
///   active MTU; 0 takes `base`'s.
pub(crate) fn remote_av(
    base: &PortAv,
    remote: &RemoteAv,
    active_mtu: u32,
    gids: &[PortGid],
) -> Result<PortAv, String> {
    let gids: Vec<(i32, [u8; 16])> = sendable(gids).iter().map(|g| (g.index, g.gid)).collect();
    let mut av = *base;
    av.lid = remote.lid;
    av.mtu = match remote.mtu {
        0 => base.mtu,
        m if (IBV_MTU_256..=IBV_MTU_4096).contains(&m) => m.min(active_mtu.max(IBV_MTU_256)),
        m => return Err(format!("path MTU {m} is not one of ibverbs' (1 to 5)")),
    };
    let dgid = remote.gid;
    if base.gid.is_none() {
        // InfiniBand: LID-routed unless the guest names a GID.
        if dgid != [0; 16] {
            av.gid_index = Some(0);
            av.gid = Some(ibv_gid { raw: dgid });
        } else if remote.lid == 0 {
            return Err("an InfiniBand address vector needs the peer's LID or GID".into());
        }
        return Ok(av);
    }
    if dgid == [0; 16] {
        return Err("a RoCE address vector needs the peer's GID (global route)".into());
    }
    let want_v4 = v4_mapped(&dgid);
    let own = base
        .gid_index
        .zip(base.gid.map(|g| g.raw()))
        .filter(|(i, _)| gids.iter().any(|(j, _)| i == j));
    let kind = |g: &[u8; 16]| v4_mapped(g) == want_v4;
    let pick = own
        .filter(|(_, g)| kind(g) && (want_v4 || link_local(g) == link_local(&dgid)))
        .or_else(|| {
            gids.iter()
                .copied()
                .find(|(_, g)| kind(g) && (want_v4 || link_local(g) == link_local(&dgid)))
        })
        .or_else(|| own.filter(|(_, g)| kind(g)))
        .or_else(|| gids.iter().copied().find(|(_, g)| kind(g)));
    let Some((index, _)) = pick else {
        return Err(format!(
            "the port has no {} GID to reach {}",
            if want_v4 { "IPv4 (RoCE v2)" } else { "IPv6" },
            std::net::Ipv6Addr::from(dgid)
        ));
    };
    av.gid_index = Some(index);
    av.gid = Some(ibv_gid { raw: dgid });
    Ok(av)
}

#[cfg(test)]
mod tests {
    use super::super::abi::{IBV_MTU_1024, IBV_MTU_2048};
    use super::*;

    fn g(s: &str) -> [u8; 16] {
        s.parse::<std::net::Ipv6Addr>().unwrap().octets()
    }

    /// A RoCE v2 entry.
    fn v2(index: i32, s: &str) -> PortGid {
        PortGid {
            index,
            gid: g(s),
            ty: Some(IBV_GID_TYPE_ROCE_V2),
        }
    }

    fn roce(index: i32, gid: [u8; 16]) -> PortAv {
        PortAv {
            port: 1,
            lid: 0,
            gid_index: Some(index),
            gid: Some(ibv_gid { raw: gid }),
            mtu: IBV_MTU_1024,
        }
    }

    fn peer(gid: [u8; 16], mtu: u32) -> RemoteAv {
        RemoteAv {
            gid,
            lid: 0,
            qpn: 0x11,
            psn: 0x22,
            mtu,
        }
    }

    #[test]
    fn the_source_gid_is_of_the_peer_s_family() {
        // rxe0 on dummy0: index 0 link-local, 1 the IPv4 address, 2 a global IPv6 one.
        let table = [
            v2(0, "fe80::1"),
            v2(1, "::ffff:10.77.0.1"),
            v2(2, "fd00::1"),
        ];
        let base = roce(0, table[0].gid);
        let av = remote_av(&base, &peer(g("::ffff:10.77.0.9"), 0), 4, &table).unwrap();
        assert_eq!(av.gid_index, Some(1));
        assert_eq!(av.gid.map(|x| x.raw()), Some(g("::ffff:10.77.0.9")));
        assert_eq!(av.mtu, IBV_MTU_1024);
        let av = remote_av(&base, &peer(g("fd00::9"), 0), 4, &table).unwrap();
        assert_eq!(av.gid_index, Some(2));
        let av = remote_av(&base, &peer(g("fe80::9"), 0), 4, &table).unwrap();
        assert_eq!(av.gid_index, Some(0));
        // Without an IPv4 GID an IPv4 peer is unreachable; a RoCE peer needs a GID.
        let e = remote_av(&base, &peer(g("::ffff:10.77.0.9"), 0), 4, &table[..1]).unwrap_err();
        assert!(e.contains("no IPv4 (RoCE v2) GID"), "{e}");
        let e = remote_av(&base, &peer([0; 16], 0), 4, &table).unwrap_err();
        assert!(e.contains("needs the peer's GID"), "{e}");
    }

    /// mlx5 lists every address twice, RoCE v1 first: the source GID is the v2 entry of the
    /// peer's family, even when the port's own (first) GID is v1.
    #[test]
    fn the_source_gid_is_roce_v2_on_a_table_mixing_v1_and_v2() {
        let v1 = |index, s: &str| PortGid {
            ty: Some(super::super::abi::IBV_GID_TYPE_ROCE_V1),
            ..v2(index, s)
        };
        let table = [
            v1(0, "fe80::1"),
            v2(1, "fe80::1"),
            v1(2, "::ffff:10.77.0.1"),
            v2(3, "::ffff:10.77.0.1"),
            v1(4, "fd00::1"),
            v2(5, "fd00::1"),
        ];
        for base in [roce(0, table[0].gid), roce(2, table[2].gid)] {
            for (peer_gid, want) in [("::ffff:10.77.0.9", 3), ("fd00::9", 5), ("fe80::9", 1)] {
                let av = remote_av(&base, &peer(g(peer_gid), 0), 4, &table).unwrap();
                assert_eq!(av.gid_index, Some(want), "peer {peer_gid}");
            }
        }
        // A port of RoCE v1 only (or of unreadable types) still sends, from what it has.
        let av = remote_av(
            &roce(2, table[2].gid),
            &peer(g("::ffff:10.77.0.9"), 0),
            4,
            &[table[0], table[2]],
        )
        .unwrap();
        assert_eq!(av.gid_index, Some(2));
        let s = sendable(&table);
        assert_eq!(
            s.iter().map(|e| e.index).collect::<Vec<_>>(),
            vec![1, 3, 5],
            "{s:?}"
        );
    }

    /// The guest's table: the port's own GID first, every other entry after it with its
    /// type, bounded.
    #[test]
    fn the_guest_table_starts_with_the_port_s_own_gid() {
        use super::super::abi::IBV_GID_TYPE_ROCE_V1;
        use shared_ring::abi::control::{GID_TYPE_ROCE_V1, GID_TYPE_ROCE_V2};
        let v1 = |index, s: &str| PortGid {
            ty: Some(IBV_GID_TYPE_ROCE_V1),
            ..v2(index, s)
        };
        let table = [
            v1(0, "fe80::1"),
            v2(1, "fe80::1"),
            v1(2, "::ffff:10.77.0.1"),
            PortGid {
                ty: None,
                ..v2(3, "::ffff:10.77.0.1")
            },
        ];
        assert_eq!(
            guest_table(&table, Some(3), None),
            vec![
                (g("::ffff:10.77.0.1"), GID_TYPE_ROCE_V2),
                (g("fe80::1"), GID_TYPE_ROCE_V1),
                (g("fe80::1"), GID_TYPE_ROCE_V2),
                (g("::ffff:10.77.0.1"), GID_TYPE_ROCE_V1),
            ]
        );
        let big: Vec<PortGid> = (0..40).map(|i| v2(i, "fd00::1")).collect();
        assert_eq!(guest_table(&big, None, None).len(), 16);
    }

    #[test]
    fn the_port_s_own_gid_is_its_ipv4_address_not_the_default_link_local_one() {
        // rxe0 on dummy0 with 10.77.0.1: index 0 is the default (link-local) GID, then the
        // IPv4 address; mlx5 lists each twice, RoCE v1 and v2.
        let rxe = [v2(0, "fe80::1"), v2(1, "::ffff:10.77.0.1")];
        assert_eq!(own_gid(&rxe).map(|g| g.index), Some(1));
        let global = [v2(0, "fe80::1"), v2(1, "fd00::7"), v2(2, "::ffff:10.0.0.1")];
        assert_eq!(own_gid(&global).map(|g| g.index), Some(2));
        assert_eq!(own_gid(&global[..2]).map(|g| g.index), Some(1));
        assert_eq!(own_gid(&global[..1]).map(|g| g.index), Some(0));
        assert_eq!(own_gid(&[]), None);
    }

    #[test]
    fn the_guest_s_gid_0_is_the_backend_s_published_address() {
        let table = [
            v2(0, "fe80::1"),
            v2(1, "fd00::7"),
            v2(2, "::ffff:10.77.0.1"),
        ];
        let addr = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
        let firsts = |a| guest_table(&table, Some(0), a)[0].0;
        assert_eq!(firsts(addr("10.77.0.1")), g("::ffff:10.77.0.1"));
        assert_eq!(firsts(addr("fd00::7")), g("fd00::7"));
        // An address the port does not hold, or none: the port's own GID leads.
        assert_eq!(firsts(addr("10.9.9.9")), g("fe80::1"));
        assert_eq!(firsts(None), g("fe80::1"));
        assert_eq!(guest_table(&table, Some(0), addr("10.77.0.1")).len(), 3);
    }

    #[test]
    fn sysfs_gid_types() {
        use super::super::abi::IBV_GID_TYPE_ROCE_V1;
        use super::super::gid_type_of_sysfs;
        assert_eq!(gid_type_of_sysfs("RoCE v2\n"), Some(IBV_GID_TYPE_ROCE_V2));
        assert_eq!(
            gid_type_of_sysfs("IB/RoCE v1\n"),
            Some(IBV_GID_TYPE_ROCE_V1)
        );
        assert_eq!(gid_type_of_sysfs(""), None);
    }

    #[test]
    fn the_path_mtu_is_the_guest_s_within_the_port_s() {
        let table = [v2(1, "::ffff:10.77.0.1")];
        let base = roce(1, table[0].gid);
        let p = |m| remote_av(&base, &peer(g("::ffff:10.77.0.2"), m), IBV_MTU_2048, &table);
        assert_eq!(p(0).unwrap().mtu, IBV_MTU_1024);
        assert_eq!(p(1).unwrap().mtu, IBV_MTU_256);
        assert_eq!(p(4).unwrap().mtu, IBV_MTU_2048);
        assert_eq!(p(5).unwrap().mtu, IBV_MTU_2048);
        assert!(p(6).unwrap_err().contains("path MTU 6"));
    }

    #[test]
    fn infiniband_peers_are_lids_unless_a_gid_is_named() {
        let base = PortAv {
            port: 1,
            lid: 3,
            gid_index: None,
            gid: None,
            mtu: IBV_MTU_1024,
        };
        let mut r = peer([0; 16], 0);
        assert!(remote_av(&base, &r, 4, &[]).is_err());
        r.lid = 7;
        let av = remote_av(&base, &r, 4, &[]).unwrap();
        assert_eq!((av.lid, av.gid_index), (7, None));
        r.gid = g("fe80::7");
        let av = remote_av(&base, &r, 4, &[]).unwrap();
        assert_eq!(av.gid_index, Some(0));
    }
}
