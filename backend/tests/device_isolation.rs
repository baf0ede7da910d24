//! A guest can only hurt itself (issue 10): an attacker's QPs, handles and keys never reach a
//! good pair running beside it. Every test keeps a good pair (two domains) busy before and
//! after the attack and checks it is unaffected.

use std::collections::HashSet;

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::{CqeOpcode, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::WqeOpcode;
use vrdma_backend::device::testkit::{wqe, TestChannel, TestCq, TestMr, TestPair, TestQp};
use vrdma_backend::device::{ChannelMode, Device, EngineConfig, SoftDevice};

const ALL: u32 = access::ALL;

fn device() -> SoftDevice {
    SoftDevice::new(EngineConfig::default()).expect("device")
}

/// A connected pair of two domains with a buffer each.
struct Good {
    a: TestChannel,
    b: TestChannel,
    acq: TestCq,
    bcq: TestCq,
    aqp: TestQp,
    bqp: TestQp,
    amr: TestMr,
    bmr: TestMr,
    round: u64,
}

impl Good {
    fn new(dev: &SoftDevice, doms: (u16, u16)) -> Good {
        let TestPair {
            mut a,
            mut b,
            acq,
            bcq,
            aqp,
            bqp,
        } = TestPair::connected(dev, doms, ChannelMode::Bypass);
        let amr = a.mr(dev, 4096, ALL);
        let bmr = b.mr(dev, 4096, ALL);
        let mut g = Good {
            a,
            b,
            acq,
            bcq,
            aqp,
            bqp,
            amr,
            bmr,
            round: 0,
        };
        g.check(dev);
        g
    }

    /// A SEND each way and an RDMA WRITE succeed; both QPs are RTS and no disconnect or fatal
    /// event ever reached either channel.
    fn check(&mut self, dev: &SoftDevice) {
        self.round += 1;
        let r = self.round;
        assert_eq!(dev.qp_state(self.a.id, self.aqp.num), Ok(QpState::Rts));
        assert_eq!(dev.qp_state(self.b.id, self.bqp.num), Ok(QpState::Rts));
        let msg = [r as u8; 64];
        self.amr.fill(0, &msg);
        self.bqp.post_recv(dev, r, &[self.bmr.sge(0, 64)]);
        self.aqp.post_send(
            dev,
            &wqe(WqeOpcode::Send, r, &[self.amr.sge(0, 64)], (0, 0), 0),
        );
        let c = self.acq.wait(dev);
        assert_eq!((c.wr_id, c.status), (r, CqeStatus::Success));
        let c = self.bcq.wait(dev);
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (r, CqeStatus::Success, CqeOpcode::Recv)
        );
        assert_eq!(self.bmr.read(0, 64), msg);
        self.aqp.post_recv(dev, r, &[self.amr.sge(64, 64)]);
        self.bqp.post_send(
            dev,
            &wqe(WqeOpcode::Send, r, &[self.bmr.sge(0, 64)], (0, 0), 0),
        );
        assert_eq!(self.bcq.wait(dev).status, CqeStatus::Success);
        assert_eq!(self.acq.wait(dev).status, CqeStatus::Success);
        assert_eq!(self.amr.read(64, 64), msg);
        self.aqp.post_send(
            dev,
            &wqe(
                WqeOpcode::RdmaWrite,
                r,
                &[self.amr.sge(0, 8)],
                (self.bmr.iova + 512, self.bmr.keys.rkey),
                0,
            ),
        );
        assert_eq!(self.acq.wait(dev).status, CqeStatus::Success);
        assert_eq!(self.bmr.read(512, 8), [r as u8; 8]);
        for ch in [&mut self.a, &mut self.b] {
            for e in ch.take_events() {
                assert!(
                    !matches!(e.kind, EventKind::QpDisconnected | EventKind::QpFatal),
                    "good pair got {e:?}"
                );
            }
        }
    }
}

#[test]
fn a_half_open_connect_then_destroy_or_close_leaves_the_pair_alone() {
    let dev = device();
    let mut good = Good::new(&dev, (1, 2));
    let x = good.bqp.num;
    // The stranger names X (connected to A) from a QP it then destroys.
    let mut e = TestChannel::open(&dev, 5, ChannelMode::Bypass);
    let ecq = e.cq(&dev, 6);
    let z = e.qp(&dev, &ecq, &ecq, 4);
    dev.connect_qp(e.id, z.num, x)
        .expect("a half-open connect waits");
    assert_eq!(dev.qp_state(e.id, z.num), Ok(QpState::Rtr));
    good.check(&dev);
    dev.destroy_qp(e.id, z.num).unwrap();
    good.check(&dev);
    // The same through closing the channel, with both good QPs named.
    let z1 = e.qp(&dev, &ecq, &ecq, 4);
    let z2 = e.qp(&dev, &ecq, &ecq, 4);
    dev.connect_qp(e.id, z1.num, good.aqp.num).unwrap();
    dev.connect_qp(e.id, z2.num, good.bqp.num).unwrap();
    dev.close_channel(e.id);
    good.check(&dev);

    // A pair still connecting: Y names W, a stranger names Y and goes away, then W names Y.
    let mut c = TestChannel::open(&dev, 3, ChannelMode::Bypass);
    let mut d = TestChannel::open(&dev, 4, ChannelMode::Bypass);
    let mut ccq = c.cq(&dev, 6);
    let dcq = d.cq(&dev, 6);
    let mut y = c.qp(&dev, &ccq, &ccq, 4);
    let w = d.qp(&dev, &dcq, &dcq, 4);
    dev.connect_qp(c.id, y.num, w.num).unwrap();
    let mut e = TestChannel::open(&dev, 5, ChannelMode::Bypass);
    let ecq = e.cq(&dev, 6);
    let z = e.qp(&dev, &ecq, &ecq, 4);
    dev.connect_qp(e.id, z.num, y.num).unwrap();
    dev.destroy_qp(e.id, z.num).unwrap();
    dev.connect_qp(d.id, w.num, y.num).unwrap();
    assert_eq!(dev.qp_state(c.id, y.num), Ok(QpState::Rts));
    assert_eq!(dev.qp_state(d.id, w.num), Ok(QpState::Rts));
    let m = d.mr(&dev, 4096, ALL);
    let l = c.mr(&dev, 4096, ALL);
    y.post_send(
        &dev,
        &wqe(
            WqeOpcode::RdmaWrite,
            1,
            &[l.sge(0, 8)],
            (m.iova, m.keys.rkey),
            0,
        ),
    );
    assert_eq!(ccq.wait(&dev).status, CqeStatus::Success);
    assert!(c
        .take_events()
        .iter()
        .all(|e| e.kind != EventKind::QpDisconnected));
    good.check(&dev);
}

#[test]
fn refused_connects_look_the_same_and_qp_numbers_are_not_sequential() {
    let dev = device();
    let mut good = Good::new(&dev, (1, 2));
    let mut e = TestChannel::open(&dev, 5, ChannelMode::Bypass);
    let ecq = e.cq(&dev, 6);
    // A number that certainly names no QP: one that was destroyed.
    let gone = e.qp(&dev, &ecq, &ecq, 4).num;
    dev.destroy_qp(e.id, gone).unwrap();
    // A foreign QP still in Init (it named nobody), one connected to someone else, one that
    // named a third QP and waits.
    let mut f = TestChannel::open(&dev, 6, ChannelMode::Bypass);
    let fcq = f.cq(&dev, 6);
    let idle = f.qp(&dev, &fcq, &fcq, 4).num;
    let waiting = f.qp(&dev, &fcq, &fcq, 4).num;
    dev.connect_qp(f.id, waiting, good.aqp.num).unwrap();
    let _ = e.take_events();
    for remote in [gone, idle, good.bqp.num, waiting] {
        let z = e.qp(&dev, &ecq, &ecq, 4);
        assert_eq!(dev.connect_qp(e.id, z.num, remote), Ok(()), "{remote:?}");
        assert_eq!(dev.qp_state(e.id, z.num), Ok(QpState::Rtr));
        // And the number cannot be tried twice from the same QP (same answer for all).
        assert_eq!(
            dev.connect_qp(e.id, z.num, remote).map_err(|e| e.status()),
            Err(shared_ring::abi::control::Status::ConnectionRefused)
        );
    }
    assert!(e.take_events().is_empty(), "no event tells the cases apart");
    assert_eq!(dev.qp_state(f.id, idle), Ok(QpState::Init));
    assert_eq!(dev.qp_state(f.id, waiting), Ok(QpState::Rtr));
    good.check(&dev);

    // Numbers handed out back to back on one channel are not a progression.
    let nums: Vec<u32> = (0..8).map(|_| e.qp(&dev, &ecq, &ecq, 2).num.0).collect();
    let steps: HashSet<u32> = nums.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    assert!(steps.len() > 1, "QP numbers are a progression: {nums:?}");
    dev.close_channel(e.id);
    good.check(&dev);
}

/// QP numbers are InfiniBand's 24 bits: verbs programs print and exchange them that wide
/// (`ibv_rc_pingpong` formats `%06x` into a fixed buffer; docs/verbs.md).
#[test]
fn qp_numbers_fit_24_bits() {
    let dev = device();
    let mut e = TestChannel::open(&dev, 5, ChannelMode::Bypass);
    let cq = e.cq(&dev, 6);
    let nums: Vec<u32> = (0..12).map(|_| e.qp(&dev, &cq, &cq, 2).num.0).collect();
    assert!(nums.iter().all(|&n| n != 0 && n < 1 << 24), "{nums:x?}");
    dev.close_channel(e.id);
}

/// Every handle a good pair holds.
fn handles(g: &Good) -> Vec<u32> {
    vec![
        g.a.id.0,
        g.b.id.0,
        g.a.pd.0,
        g.b.pd.0,
        g.acq.id.0,
        g.bcq.id.0,
        g.aqp.num.0,
        g.bqp.num.0,
        g.amr.keys.handle.0,
        g.bmr.keys.handle.0,
    ]
}

#[test]
fn handles_are_never_reused_while_live_when_the_counter_wraps() {
    let dev = device();
    let mut good = Good::new(&dev, (1, 2));
    let mut live: HashSet<u32> = handles(&good).into_iter().collect();
    assert_eq!(live.len(), 10);
    // The counter comes round: the next values are the ones the good pair got first.
    dev.set_handle_counter(u32::MAX - 5);
    let mut e = TestChannel::open(&dev, 5, ChannelMode::Bypass);
    let mut fresh = vec![e.id.0, e.pd.0];
    let mut qps = Vec::new();
    for _ in 0..8 {
        let cq = e.cq(&dev, 2);
        let qp = e.qp(&dev, &cq, &cq, 2);
        let mr = e.mr(&dev, 4096, ALL);
        let pd = dev.alloc_pd(e.id).unwrap();
        fresh.extend([cq.id.0, qp.num.0, mr.keys.handle.0, pd.0]);
        qps.push(qp);
    }
    for h in &fresh {
        assert_ne!(*h, 0);
        assert!(live.insert(*h), "handle {h:#x} handed out twice");
    }
    // The attacker's objects are its own; the good pair's still are the good pair's.
    for qp in &qps {
        dev.destroy_qp(e.id, qp.num).unwrap();
    }
    assert_eq!(
        dev.qp_state(e.id, good.aqp.num).map_err(|e| e.status()),
        Err(shared_ring::abi::control::Status::BadHandle)
    );
    dev.close_channel(e.id);
    good.check(&dev);
    assert_eq!(dev.stats(good.a.id).qps, 1);
    assert_eq!(dev.stats(good.a.id).mrs, 1);
    assert_eq!(dev.stats(good.a.id).cqs, 1);
}

#[test]
fn a_revoked_rkey_stays_invalid_while_its_slot_is_reused() {
    let dev = device();
    let mut good = Good::new(&dev, (1, 2));
    let mut p = Good::new(&dev, (3, 4));
    // B revokes a region; then registers and deregisters over and over (the key table's
    // freshest free slot each time).
    let old = p.b.mr(&dev, 4096, ALL);
    let (lkey0, rkey0) = (old.keys.lkey, old.keys.rkey);
    dev.dereg_mr(p.b.id, old.keys.handle).unwrap();
    let mut seen = HashSet::new();
    for i in 0..400 {
        let m = p.b.mr_at(&dev, 4096, ALL, 0);
        assert_ne!(m.keys.rkey, rkey0, "registration {i} got the revoked rkey");
        assert_ne!(m.keys.lkey, lkey0, "registration {i} got the revoked lkey");
        assert!(seen.insert(m.keys.rkey), "rkey repeated at {i}");
        dev.dereg_mr(p.b.id, m.keys.handle).unwrap();
    }
    // A live region in B; A writes through the revoked rkey (at the live region's address).
    let live = p.b.mr(&dev, 4096, ALL);
    live.fill(0, &[0x3c; 4096]);
    p.aqp.post_send(
        &dev,
        &wqe(
            WqeOpcode::RdmaWrite,
            9,
            &[p.amr.sge(0, 64)],
            (live.iova, rkey0),
            0,
        ),
    );
    let c = p.acq.wait(&dev);
    assert_eq!((c.wr_id, c.status), (9, CqeStatus::RemoteAccessError));
    assert_eq!(live.read(0, 4096), vec![0x3c; 4096]);
    good.check(&dev);

    // The key counter wraps with regions registered: their keys are skipped.
    dev.set_key_counter((1 << 31) - 3);
    let mut keys: HashSet<u32> = [
        good.amr.keys.rkey,
        good.bmr.keys.rkey,
        p.amr.keys.rkey,
        live.keys.rkey,
    ]
    .into_iter()
    .collect();
    for _ in 0..12 {
        let m = p.b.mr(&dev, 4096, ALL);
        assert_ne!(m.keys.lkey, 0);
        assert!(
            keys.insert(m.keys.rkey),
            "live rkey {:#x} reissued",
            m.keys.rkey
        );
    }
    good.check(&dev);
}

#[test]
fn a_valid_rkey_of_a_third_domain_is_refused() {
    let dev = device();
    let mut good = Good::new(&dev, (1, 2));
    let mut p = Good::new(&dev, (3, 4));
    let mut c = TestChannel::open(&dev, 5, ChannelMode::Bypass);
    let theirs = c.mr(&dev, 4096, ALL);
    theirs.fill(0, &[0x77; 4096]);
    // A, connected to B, writes with C's (valid, REMOTE_WRITE) rkey.
    p.amr.fill(0, &[0x11; 256]);
    p.aqp.post_send(
        &dev,
        &wqe(
            WqeOpcode::RdmaWrite,
            1,
            &[p.amr.sge(0, 256)],
            (theirs.iova, theirs.keys.rkey),
            0,
        ),
    );
    let r = p.acq.wait(&dev);
    assert_eq!((r.wr_id, r.status), (1, CqeStatus::RemoteAccessError));
    assert_eq!(theirs.read(0, 4096), vec![0x77; 4096]);
    // The responder is not affected by a requester's bad rkey.
    assert_eq!(dev.qp_state(p.b.id, p.bqp.num), Ok(QpState::Rts));
    good.check(&dev);

    // Reading with it from a fresh pair: refused, the local buffer untouched.
    let mut q = Good::new(&dev, (3, 4));
    q.amr.fill(0, &[0x22; 256]);
    q.aqp.post_send(
        &dev,
        &wqe(
            WqeOpcode::RdmaRead,
            2,
            &[q.amr.sge(0, 256)],
            (theirs.iova, theirs.keys.rkey),
            0,
        ),
    );
    let r = q.acq.wait(&dev);
    assert_eq!((r.wr_id, r.status), (2, CqeStatus::RemoteAccessError));
    assert_eq!(q.amr.read(0, 256), vec![0x22; 256]);
    assert_eq!(theirs.read(0, 4096), vec![0x77; 4096]);
    good.check(&dev);
}
