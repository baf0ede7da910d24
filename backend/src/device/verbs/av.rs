//! Address vectors of a guest's RTR (`ConnectAv`): which of the port's GIDs is the source
//! and which path MTU the QP uses. Pure functions over the port's GID table (tested without
//! a device).

use super::abi::{ibv_gid, IBV_MTU_256, IBV_MTU_4096};
use super::probe::PortAv;
use crate::device::RemoteAv;

/// Whether a GID is an IPv4-mapped IPv6 address (RoCE v2 of an IPv4 address).
fn v4_mapped(g: &[u8; 16]) -> bool {
    g[..10] == [0; 10] && g[10..12] == [0xff, 0xff]
}

fn link_local(g: &[u8; 16]) -> bool {
    g[0] == 0xfe && g[1] & 0xc0 == 0x80
}

/// The address vector towards `remote` from the port `base` describes, whose GID table holds
/// the non-zero entries `gids` (index, GID) and whose active MTU is `active_mtu`.
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
    gids: &[(i32, [u8; 16])],
) -> Result<PortAv, String> {
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
    let own = base.gid_index.zip(base.gid.map(|g| g.raw()));
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
            (0, g("fe80::1")),
            (1, g("::ffff:10.77.0.1")),
            (2, g("fd00::1")),
        ];
        let base = roce(0, table[0].1);
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

    #[test]
    fn the_path_mtu_is_the_guest_s_within_the_port_s() {
        let table = [(1, g("::ffff:10.77.0.1"))];
        let base = roce(1, table[0].1);
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
