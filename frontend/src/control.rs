//! The control-ring client: many requests in flight, each matched to its response by `req_id`
//! (responses may come out of order: the backend answers `Connect` only when the QP is
//! connected), safe to use from several threads at once.
//!
//! The ring is the `io/ring.h` front end from `shared-ring`; notifications follow its hold-off
//! rules (`push_requests_and_check_notify`, `final_check_for_responses`), so a busy backend
//! is not notified per request and we are not woken per response. Whoever holds the lock
//! drains every response on the ring and files it under its `req_id`; a waiter spins briefly
//! (the backend usually answers within microseconds), then blocks on the channel's event
//! channel. A thread that files a response for another waiter (or frees a ring slot someone
//! waits for) wakes the sleepers. When all ring slots are taken, callers wait for one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use shared_ring::abi::control::{Op, Reply, Request, RequestRepr, ResponseRepr, Status};
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
    /// Requests on the ring whose caller still waits: req_id → op.
    waiting: HashMap<u32, Op>,
    /// Responses filed for their waiter.
    done: HashMap<u32, Result<Reply>>,
    /// Callers blocked on the event channel (to be woken when their answer is filed by
    /// another thread or a ring slot frees up).
    sleepers: usize,
}

impl State {
    /// Moves every response on the ring to `done`. Returns how many were taken off the ring.
    fn drain(&mut self) -> Result<usize> {
        let mut n = 0;
        while let Some(raw) = self.ring.next_response()? {
            n += 1;
            let rsp = match ResponseRepr::parse(&raw) {
                Ok(r) => r,
                Err(e) => {
                    // A response we cannot read: nobody can be matched to it, so the channel
                    // is unusable for whoever waits; tell them all.
                    let why = format!("unparsable control response: {e}");
                    for id in self.waiting.keys().copied().collect::<Vec<_>>() {
                        self.done.insert(id, Err(Error::protocol(why.clone())));
                    }
                    self.waiting.clear();
                    continue;
                }
            };
            let Some(op) = self.waiting.remove(&rsp.req_id) else {
                // A late answer to a request whose caller gave up (timeout).
                tracing::warn!(
                    req_id = rsp.req_id,
                    "discarding a control response nobody waits for"
                );
                continue;
            };
            let r = if rsp.op != op {
                Err(Error::protocol(format!(
                    "response to {op:?} request {} claims to answer {:?}",
                    rsp.req_id, rsp.op
                )))
            } else {
                match rsp.status {
                    Status::Ok => Ok(rsp.reply),
                    status => Err(Error::Backend { op, status }),
                }
            };
            self.done.insert(rsp.req_id, r);
        }
        Ok(n)
    }

    /// A fresh request id not in use.
    fn take_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.waiting.contains_key(&id) && !self.done.contains_key(&id) {
                return id;
            }
        }
    }
}

impl Control {
    pub(crate) fn new(ring: ControlFrontRing, timeout: Duration) -> Control {
        Control {
            state: Mutex::new(State {
                ring,
                next_id: 1,
                waiting: HashMap::new(),
                done: HashMap::new(),
                sleepers: 0,
            }),
            timeout,
        }
    }

    /// How long a call waits for its answer.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Control::call_checked`] with no liveness check (the tests' backends stay).
    #[cfg(test)]
    pub(crate) fn call(&self, signal: &dyn Signal, request: Request) -> Result<Reply> {
        self.call_checked(signal, request, &|| Ok(()))
    }

    /// Sends `request` and waits for its response. A response with an error status is
    /// [`Error::Backend`]; no response within the timeout is [`Error::Timeout`]. After every
    /// wakeup `gone` says whether the backend is still there: its error ends the wait (a dead
    /// backend answers nothing). Any number of threads may call at once; with every ring slot
    /// taken, a call waits for a free one.
    pub(crate) fn call_checked(
        &self,
        signal: &dyn Signal,
        request: Request,
        gone: &dyn Fn() -> Result<()>,
    ) -> Result<Reply> {
        let op = request.op();
        let start = Instant::now();
        let deadline = start + self.timeout;
        let timeout = || Error::Timeout {
            what: format!("the backend's answer to {op:?}"),
            timeout_ms: self.timeout.as_millis() as u64,
        };

        // 1. A ring slot, then the request on the ring.
        let req_id = loop {
            let epoch = signal.epoch();
            let mut st = self.lock();
            if st.drain()? > 0 && st.sleepers > 0 {
                signal.wake_all();
            }
            if !st.ring.is_full() {
                let req_id = st.take_id();
                let slot = RequestRepr { req_id, request }.to_bytes();
                st.ring.write_request(&slot)?;
                st.waiting.insert(req_id, op);
                if st.ring.push_requests_and_check_notify() {
                    drop(st);
                    signal.notify()?;
                }
                break req_id;
            }
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            if st.ring.final_check_for_responses()? {
                continue;
            }
            st.sleepers += 1;
            drop(st);
            let r = signal.wait_after(epoch, Some(deadline));
            self.lock().sleepers -= 1;
            r?;
            gone()?;
        };

        // 2. Its answer.
        loop {
            let epoch = signal.epoch();
            let mut st = self.lock();
            if st.drain()? > 0 && st.sleepers > 0 {
                // Answers (or free slots) for others: wake whoever sleeps.
                signal.wake_all();
            }
            if let Some(r) = st.done.remove(&req_id) {
                return r;
            }
            let now = Instant::now();
            if now - start < SPIN {
                drop(st);
                std::hint::spin_loop();
                continue;
            }
            if st.ring.final_check_for_responses()? {
                continue;
            }
            if now >= deadline {
                st.waiting.remove(&req_id);
                return Err(timeout());
            }
            st.sleepers += 1;
            drop(st);
            let r = signal.wait_after(epoch, Some(deadline));
            let mut st = self.lock();
            st.sleepers -= 1;
            if let Err(e) = r.and_then(|_| gone()) {
                st.waiting.remove(&req_id);
                return Err(e);
            }
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
        fn wake_all(&self) {
            *self.0.to_front.0.lock().unwrap() += 1;
            self.0.to_front.1.notify_all();
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

    /// Many threads, more requests than ring slots, answers in reverse order and in batches:
    /// each caller gets its own answer.
    #[test]
    fn concurrent_callers_get_their_own_out_of_order_answers() {
        let region = SharedRegion::alloc(4096).unwrap();
        let ring = ControlFrontRing::init(region.clone()).unwrap();
        let ctl = Arc::new(Control::new(ring, Duration::from_secs(60)));
        let pair = Arc::new(Pair::default());
        let stop = Arc::new(AtomicBool::new(false));
        let back = {
            let (pair, stop) = (pair.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut back = ControlBackRing::new(region).unwrap();
                let mut held: Vec<RequestRepr> = Vec::new();
                let mut idle = 0;
                let mut served = 0;
                while !stop.load(Ordering::Relaxed) {
                    let mut got = false;
                    while let Some(raw) = back.next_request().unwrap() {
                        held.push(RequestRepr::parse(&raw).unwrap());
                        got = true;
                    }
                    idle = if got { 0 } else { idle + 1 };
                    // Answer in batches of 8 (newest first), or whatever is held when idle.
                    if held.len() >= 8 || (idle > 3 && !held.is_empty()) {
                        let mut notify = false;
                        while let Some(req) = held.pop() {
                            let Request::QueryPort { port } = req.request else {
                                panic!("{req:?}")
                            };
                            let rsp = ResponseRepr {
                                req_id: req.req_id,
                                op: Op::QueryPort,
                                status: Status::Ok,
                                reply: Reply::Port {
                                    state: port,
                                    active_mtu: 0,
                                    speed_mbps: 0,
                                    gid: [0; 16],
                                },
                            };
                            back.write_response(&rsp.to_bytes()).unwrap();
                            notify |= back.push_responses_and_check_notify();
                            served += 1;
                        }
                        if notify {
                            *pair.to_front.0.lock().unwrap() += 1;
                            pair.to_front.1.notify_all();
                        }
                    }
                    if !back.final_check_for_requests().unwrap() {
                        let g = pair.to_back.0.lock().unwrap();
                        let _ = pair
                            .to_back
                            .1
                            .wait_timeout(g, Duration::from_millis(2))
                            .unwrap();
                    }
                }
                served
            })
        };
        let threads: Vec<_> = (0..48u32)
            .map(|t| {
                let (ctl, pair) = (ctl.clone(), pair.clone());
                std::thread::spawn(move || {
                    let front = Front(pair);
                    for i in 0..20u32 {
                        let port = t * 1000 + i;
                        match ctl.call(&front, Request::QueryPort { port }).unwrap() {
                            Reply::Port { state, .. } => assert_eq!(state, port),
                            r => panic!("{r:?}"),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(back.join().unwrap(), 48 * 20);
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
