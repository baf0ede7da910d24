//! The control-ring client: one request at a time, matched to its response by `req_id`.
//!
//! The ring is the `io/ring.h` front end from `shared-ring`; notifications follow its hold-off
//! rules (`push_requests_and_check_notify`, `final_check_for_responses`), so a busy backend
//! is not notified per request and we are not woken per response. A waiting caller spins
//! briefly (the backend usually answers within microseconds), then blocks on the channel's
//! event channel.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use shared_ring::abi::control::{Reply, Request, RequestRepr, ResponseRepr, Status};
use shared_ring::ControlFrontRing;

use crate::error::{Error, Result};
use crate::signal::Signal;

/// How long a caller spins on the ring before blocking on the event channel.
const SPIN: Duration = Duration::from_micros(50);

/// The front end of a channel's control ring.
pub(crate) struct Control {
    state: Mutex<State>,
    timeout: Duration,
}

struct State {
    ring: ControlFrontRing,
    next_id: u32,
}

impl Control {
    pub(crate) fn new(ring: ControlFrontRing, timeout: Duration) -> Control {
        Control {
            state: Mutex::new(State { ring, next_id: 1 }),
            timeout,
        }
    }

    /// Sends `request` and waits for its response. A response with an error status is
    /// [`Error::Backend`]; no response within the timeout is [`Error::Timeout`].
    pub(crate) fn call(&self, signal: &dyn Signal, request: Request) -> Result<Reply> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let req_id = st.next_id;
        st.next_id = st.next_id.wrapping_add(1).max(1);
        let op = request.op();
        let slot = RequestRepr { req_id, request }.to_bytes();
        st.ring.write_request(&slot)?;
        if st.ring.push_requests_and_check_notify() {
            signal.notify()?;
        }
        let start = Instant::now();
        let deadline = start + self.timeout;
        loop {
            let epoch = signal.epoch();
            while let Some(raw) = st.ring.next_response()? {
                let rsp = ResponseRepr::parse(&raw)?;
                if rsp.req_id != req_id {
                    // Only one request is ever outstanding; anything else is a late answer to
                    // a request that timed out.
                    tracing::warn!(
                        req_id = rsp.req_id,
                        "discarding a control response nobody waits for"
                    );
                    continue;
                }
                if rsp.op != op {
                    return Err(Error::protocol(format!(
                        "response to {op:?} request {req_id} claims to answer {:?}",
                        rsp.op
                    )));
                }
                return match rsp.status {
                    Status::Ok => Ok(rsp.reply),
                    status => Err(Error::Backend { op, status }),
                };
            }
            let now = Instant::now();
            if now - start < SPIN {
                std::hint::spin_loop();
                continue;
            }
            if st.ring.final_check_for_responses()? {
                continue;
            }
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!("the backend's answer to {op:?}"),
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
            signal.wait_after(epoch, Some(deadline))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_ring::abi::control::{DeviceAttrs, Op, ResponseRepr};
    use shared_ring::{ControlBackRing, SharedRegion};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Condvar};

    /// Both directions of a fake event channel on plain memory.
    #[derive(Default)]
    struct Pair {
        to_back: (Mutex<u64>, Condvar),
        to_front: (Mutex<u64>, Condvar),
    }

    struct Front(Arc<Pair>);

    impl Signal for Front {
        fn notify(&self) -> Result<()> {
            *self.0.to_back.0.lock().unwrap() += 1;
            self.0.to_back.1.notify_all();
            Ok(())
        }
        fn epoch(&self) -> u64 {
            *self.0.to_front.0.lock().unwrap()
        }
        fn wait_after(&self, seen: u64, deadline: Option<Instant>) -> Result<bool> {
            let d = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            let mut g = self.0.to_front.0.lock().unwrap();
            while *g == seen {
                let now = Instant::now();
                if now >= d {
                    return Ok(false);
                }
                g = self.0.to_front.1.wait_timeout(g, d - now).unwrap().0;
            }
            Ok(true)
        }
    }

    /// A scripted backend: answers each request with `answer(request)` and notifies when the
    /// ring's hold-off says so. `stale` first sends a response with a wrong req_id.
    fn backend(
        region: SharedRegion,
        pair: Arc<Pair>,
        stop: Arc<AtomicBool>,
        answer: impl Fn(&RequestRepr) -> ResponseRepr + Send + 'static,
    ) -> std::thread::JoinHandle<usize> {
        std::thread::spawn(move || {
            let mut back = ControlBackRing::new(region).unwrap();
            let mut served = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut notify = false;
                while let Some(raw) = back.next_request().unwrap() {
                    let req = RequestRepr::parse(&raw).unwrap();
                    back.write_response(&answer(&req).to_bytes()).unwrap();
                    notify |= back.push_responses_and_check_notify();
                    served += 1;
                }
                if notify {
                    *pair.to_front.0.lock().unwrap() += 1;
                    pair.to_front.1.notify_all();
                }
                if !back.final_check_for_requests().unwrap() {
                    let g = pair.to_back.0.lock().unwrap();
                    let _ = pair
                        .to_back
                        .1
                        .wait_timeout(g, Duration::from_millis(5))
                        .unwrap();
                }
            }
            served
        })
    }

    fn setup() -> (SharedRegion, Control, Arc<Pair>, Arc<AtomicBool>) {
        let region = SharedRegion::alloc(4096).unwrap();
        let ring = ControlFrontRing::init(region.clone()).unwrap();
        (
            region,
            Control::new(ring, Duration::from_secs(5)),
            Arc::new(Pair::default()),
            Arc::new(AtomicBool::new(false)),
        )
    }

    #[test]
    fn requests_are_answered_in_order_and_errors_keep_the_status() {
        let (region, ctl, pair, stop) = setup();
        let h = backend(region, pair.clone(), stop.clone(), |req| {
            match req.request {
                Request::AllocPd => ResponseRepr {
                    req_id: req.req_id,
                    op: Op::AllocPd,
                    status: Status::Ok,
                    reply: Reply::Handle(req.req_id + 100),
                },
                Request::QueryDevice => ResponseRepr {
                    req_id: req.req_id,
                    op: Op::QueryDevice,
                    status: Status::Ok,
                    reply: Reply::Device(DeviceAttrs {
                        max_qp: 7,
                        ..Default::default()
                    }),
                },
                r => ResponseRepr::error(req.req_id, r.op(), Status::QuotaExceeded),
            }
        });
        let front = Front(pair.clone());
        // More requests than ring slots: indexes wrap.
        for i in 0..100u32 {
            assert_eq!(
                ctl.call(&front, Request::AllocPd).unwrap(),
                Reply::Handle(i + 1 + 100)
            );
        }
        match ctl.call(&front, Request::QueryDevice).unwrap() {
            Reply::Device(d) => assert_eq!(d.max_qp, 7),
            r => panic!("{r:?}"),
        }
        let e = ctl
            .call(&front, Request::CreateCq { cqe_log2: 4 })
            .unwrap_err();
        assert!(e.is_quota_exceeded(), "{e}");
        assert!(e.to_string().contains("max-cqs"), "{e}");
        stop.store(true, Ordering::Relaxed);
        assert_eq!(h.join().unwrap(), 102);
    }

    #[test]
    fn stale_and_mismatched_responses() {
        let (region, ctl, pair, stop) = setup();
        let h = backend(region, pair.clone(), stop.clone(), |req| ResponseRepr {
            req_id: req.req_id,
            // Claims to answer another op.
            op: Op::DeallocPd,
            status: Status::Ok,
            reply: Reply::Empty,
        });
        let front = Front(pair.clone());
        let e = ctl.call(&front, Request::AllocPd).unwrap_err();
        assert!(matches!(e, Error::Protocol(_)), "{e}");
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
    }

    #[test]
    fn a_silent_backend_is_a_timeout_not_a_hang() {
        let region = SharedRegion::alloc(4096).unwrap();
        let ring = ControlFrontRing::init(region).unwrap();
        let ctl = Control::new(ring, Duration::from_millis(200));
        let pair = Arc::new(Pair::default());
        let e = ctl.call(&Front(pair), Request::AllocPd).unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
    }
}
