//! Byte-for-byte agreement with Xen's C ring macros.
//!
//! `tests/c/ringc.c` is compiled against the installed `/usr/include/xen/io/ring.h` (Debian
//! `libxen-dev`) and drives one or both ends of a ring in a file mapped `MAP_SHARED`, while
//! this crate drives the other end (or both) in the same mapping. The same random scripts run
//! in four configurations (front/back = C/C, C/Rust, Rust/C, Rust/Rust); each step's result
//! (notify decisions of the hold-off logic, final checks, copied payload hashes, overflow
//! verdicts) and a hash of the whole shared region after each step must be identical in all.

#![cfg(not(loom))]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use shared_ring::xen_ring::{header, BackRing, FrontRing, RingError};
use shared_ring::SharedRegion;

const RING_H: &str = "/usr/include/xen/io/ring.h";

fn ringc() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        assert!(
            Path::new(RING_H).exists(),
            "\n\n*** {RING_H} is missing: install Xen's public headers with \
             `apt-get install libxen-dev` (scripts/test-all.sh does this) ***\n\n"
        );
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/ringc.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ringc");
        let st = Command::new("gcc")
            .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("run gcc (install gcc and libc6-dev)");
        assert!(
            st.success(),
            "compiling {} against {RING_H} failed",
            src.display()
        );
        out
    })
}

/// A zeroed file mapped shared, seen by Rust as a `SharedRegion`.
struct SharedFile {
    path: PathBuf,
    region: SharedRegion,
}

impl SharedFile {
    fn new(len: usize, tag: &str) -> Self {
        static SERIAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "ring-{tag}-{}-{serial}-{len}.bin",
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(len as u64).unwrap();
        let map = memmap2::MmapRaw::map_raw(&file).unwrap();
        let ptr = std::ptr::NonNull::new(map.as_mut_ptr()).unwrap();
        // SAFETY: the mapping is `len` bytes, lives in keep_alive as long as the region, and
        // in this process is only accessed through the region (the C process maps it too).
        let region = unsafe { SharedRegion::from_raw_parts(ptr, len, Box::new(map)) }.unwrap();
        Self { path, region }
    }
    fn hash(&self) -> u64 {
        let mut buf = vec![0u8; self.region.len()];
        self.region.read(0, &mut buf).unwrap();
        fnv(FNV0, &buf)
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

const FNV0: u64 = 0xcbf2_9ce4_8422_2325;
fn fnv(mut h: u64, b: &[u8]) -> u64 {
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
fn fill<const N: usize>(idx: u32, salt: u8) -> [u8; N] {
    let mut b = [0u8; N];
    for (j, x) in b.iter_mut().enumerate() {
        *x = (idx
            .wrapping_mul(31)
            .wrapping_add(j as u32 * 7)
            .wrapping_add(u32::from(salt))) as u8;
    }
    b
}

struct CProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl CProc {
    fn spawn(file: &SharedFile, entry: usize) -> Self {
        let mut child = Command::new(ringc())
            .arg(&file.path)
            .arg(file.region.len().to_string())
            .arg(entry.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }
    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut out = String::new();
        self.stdout.read_line(&mut out).unwrap();
        assert!(!out.is_empty(), "ringc died on {line:?}");
        out.trim().to_string()
    }
}

impl Drop for CProc {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "Q");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

/// The Rust side: this crate's ends of the ring.
struct RustEnds<const N: usize> {
    region: SharedRegion,
    front: Option<FrontRing<N>>,
    back: Option<BackRing<N>>,
}

impl<const N: usize> RustEnds<N> {
    fn cmd(&mut self, line: &str) -> String {
        let mut it = line.split(' ');
        let op = it.next().unwrap();
        let a: u64 = it.next().map(|x| x.parse().unwrap()).unwrap_or(0);
        match op {
            "FI" => {
                let st = a as u32;
                FrontRing::<N>::init(self.region.clone()).unwrap();
                for (off, v) in [
                    (header::REQ_PROD, st),
                    (header::RSP_PROD, st),
                    (header::REQ_EVENT, st.wrapping_add(1)),
                    (header::RSP_EVENT, st.wrapping_add(1)),
                ] {
                    self.region.store_u32(off, v, Ordering::Relaxed).unwrap();
                }
                let f = FrontRing::attach(self.region.clone(), st).unwrap();
                let out = format!("ok {}", f.size());
                self.front = Some(f);
                out
            }
            "BI" => {
                let b = BackRing::attach(self.region.clone(), a as u32).unwrap();
                let out = format!("ok {}", b.size());
                self.back = Some(b);
                out
            }
            "FP" => {
                let f = self.front.as_mut().unwrap();
                for _ in 0..a {
                    let idx = f.req_prod_pvt();
                    f.write_request(&fill::<N>(idx, b'q')).unwrap();
                }
                format!("notify {}", u8::from(f.push_requests_and_check_notify()))
            }
            "BP" => {
                let b = self.back.as_mut().unwrap();
                for _ in 0..a {
                    let idx = b.rsp_prod_pvt();
                    b.write_response(&fill::<N>(idx, b'r')).unwrap();
                }
                format!("notify {}", u8::from(b.push_responses_and_check_notify()))
            }
            "BC" => {
                let b = self.back.as_mut().unwrap();
                let (mut k, mut h) = (0, FNV0);
                while k < a {
                    let idx = b.req_cons();
                    match b.next_request().unwrap() {
                        Some(r) => {
                            assert_eq!(r, fill::<N>(idx, b'q'), "request {idx} content");
                            h = fnv(h, &r);
                            k += 1;
                        }
                        None => break,
                    }
                }
                format!("got {k} {h:016x}")
            }
            "FC" => {
                let f = self.front.as_mut().unwrap();
                let (mut k, mut h) = (0, FNV0);
                while k < a {
                    let idx = f.rsp_cons();
                    match f.next_response().unwrap() {
                        Some(r) => {
                            assert_eq!(r, fill::<N>(idx, b'r'), "response {idx} content");
                            h = fnv(h, &r);
                            k += 1;
                        }
                        None => break,
                    }
                }
                format!("got {k} {h:016x}")
            }
            "BF" => format!(
                "work {}",
                u8::from(
                    self.back
                        .as_mut()
                        .unwrap()
                        .final_check_for_requests()
                        .unwrap()
                )
            ),
            "FF" => format!(
                "work {}",
                u8::from(
                    self.front
                        .as_mut()
                        .unwrap()
                        .final_check_for_responses()
                        .unwrap()
                )
            ),
            "BO" => {
                let saved = self
                    .region
                    .load_u32(header::REQ_PROD, Ordering::Relaxed)
                    .unwrap();
                self.region
                    .store_u32(header::REQ_PROD, a as u32, Ordering::Relaxed)
                    .unwrap();
                let r = self.back.as_ref().unwrap().unconsumed_requests();
                self.region
                    .store_u32(header::REQ_PROD, saved, Ordering::Relaxed)
                    .unwrap();
                format!(
                    "overflow {}",
                    u8::from(matches!(r, Err(RingError::ProducerOverflow { .. })))
                )
            }
            _ => panic!("unknown op {op}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Side {
    C,
    Rust,
}

/// Random legal script: a model of the indexes keeps every op within what the ring allows.
fn script(seed: u64, size: u32, start: u32, steps: usize) -> Vec<String> {
    let mut rng = seed | 1;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let (mut req_prod, mut req_cons, mut rsp_prod, mut rsp_cons) = (start, start, start, start);
    let mut out = vec![format!("FI {start}"), format!("BI {start}")];
    while out.len() < steps {
        match next(7) {
            0 => {
                let free = size - req_prod.wrapping_sub(rsp_cons);
                if free > 0 {
                    let n = 1 + next(u64::from(free.min(5))) as u32;
                    req_prod = req_prod.wrapping_add(n);
                    out.push(format!("FP {n}"));
                }
            }
            1 => {
                let max = 1 + next(4) as u32;
                req_cons = req_cons.wrapping_add(max.min(req_prod.wrapping_sub(req_cons)));
                out.push(format!("BC {max}"));
            }
            2 => {
                let pending = req_cons.wrapping_sub(rsp_prod);
                if pending > 0 {
                    let n = 1 + next(u64::from(pending.min(5))) as u32;
                    rsp_prod = rsp_prod.wrapping_add(n);
                    out.push(format!("BP {n}"));
                }
            }
            3 => {
                let max = 1 + next(4) as u32;
                rsp_cons = rsp_cons.wrapping_add(max.min(rsp_prod.wrapping_sub(rsp_cons)));
                out.push(format!("FC {max}"));
            }
            4 => out.push("BF".into()),
            5 => out.push("FF".into()),
            _ => {
                // Probe the overflow check with producer values around its boundary and garbage.
                let v = match next(3) {
                    0 => rsp_prod.wrapping_add(size).wrapping_add(next(3) as u32),
                    1 => rsp_prod.wrapping_add(size).wrapping_sub(next(3) as u32),
                    _ => next(1 << 32) as u32,
                };
                out.push(format!("BO {v}"));
            }
        }
    }
    out
}

fn run<const N: usize>(len: usize, script: &[String], front: Side, back: Side) -> Vec<String> {
    let file = SharedFile::new(len, &format!("{N}-{front:?}-{back:?}"));
    let mut c = (front == Side::C || back == Side::C).then(|| CProc::spawn(&file, N));
    let mut r = RustEnds::<N> {
        region: file.region.clone(),
        front: None,
        back: None,
    };
    let mut trace = Vec::new();
    for line in script {
        let side = if line.starts_with('F') { front } else { back };
        let out = match side {
            Side::C => c.as_mut().unwrap().cmd(line),
            Side::Rust => r.cmd(line),
        };
        trace.push(format!("{line} => {out} | mem {:016x}", file.hash()));
    }
    trace
}

fn compare_all<const N: usize>(len: usize, seeds: std::ops::Range<u64>, start: u32) {
    let size = shared_ring::xen_ring::ring_entries(len, N);
    for seed in seeds {
        let s = script(seed, size, start, 300);
        let reference = run::<N>(len, &s, Side::C, Side::C);
        for (f, b) in [
            (Side::Rust, Side::C),
            (Side::C, Side::Rust),
            (Side::Rust, Side::Rust),
        ] {
            let t = run::<N>(len, &s, f, b);
            for (i, (want, got)) in reference.iter().zip(&t).enumerate() {
                assert_eq!(
                    want, got,
                    "seed {seed}, front {f:?}, back {b:?}: step {i} differs from C/C"
                );
            }
        }
        // The script must actually exercise the hold-off logic both ways.
        for pat in ["notify 1", "notify 0", "work 0", "overflow 1", "overflow 0"] {
            assert!(
                reference.iter().any(|l| l.contains(pat)),
                "seed {seed}: script never produced {pat:?}"
            );
        }
    }
}

#[test]
fn one_page_64_byte_entries_match_c() {
    compare_all::<64>(4096, 0..6, 0);
}

#[test]
fn two_page_12_byte_entries_match_c() {
    compare_all::<12>(8192, 10..14, 0);
}

#[test]
fn indexes_wrapping_at_u32_max_match_c() {
    compare_all::<64>(4096, 20..24, u32::MAX - 40);
    compare_all::<12>(4096, 30..33, u32::MAX - 300);
}

/// Free-running: the C back end serves while this crate's front end pushes, concurrently.
#[test]
fn c_back_end_serves_rust_front_end_concurrently() {
    const N: u32 = 20_000;
    let file = SharedFile::new(4096, "serve");
    let mut f = FrontRing::<64>::init(file.region.clone()).unwrap();
    let mut c = CProc::spawn(&file, 64);
    assert_eq!(c.cmd("BI 0"), "ok 32");
    writeln!(c.stdin, "SERVE {N}").unwrap();
    c.stdin.flush().unwrap();
    let (mut sent, mut got, mut h) = (0u32, 0u32, FNV0);
    while got < N {
        while sent < N && !f.is_full() {
            f.write_request(&fill::<64>(sent, b's')).unwrap();
            sent += 1;
        }
        f.push_requests_and_check_notify();
        while let Some(rsp) = f.next_response().unwrap() {
            let mut want = fill::<64>(got, b's');
            h = fnv(h, &want);
            want.iter_mut().for_each(|x| *x ^= 0x5a);
            assert_eq!(rsp, want, "response {got}");
            got += 1;
        }
        std::hint::spin_loop();
    }
    let mut line = String::new();
    c.stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("served {N} {h:016x}"));
}

/// Free-running: the C front end drives while this crate's back end answers, concurrently.
#[test]
fn rust_back_end_serves_c_front_end_concurrently() {
    const N: u32 = 20_000;
    let file = SharedFile::new(4096, "client");
    let mut c = CProc::spawn(&file, 64);
    assert_eq!(c.cmd("FI 0"), "ok 32");
    let mut b = BackRing::<64>::new(file.region.clone()).unwrap();
    writeln!(c.stdin, "CLIENT {N}").unwrap();
    c.stdin.flush().unwrap();
    let (mut done, mut h) = (0u32, FNV0);
    while done < N {
        while let Some(req) = b.next_request().unwrap() {
            assert_eq!(req, fill::<64>(done, b'c'), "request {done}");
            let mut rsp = req;
            rsp.iter_mut().for_each(|x| *x = x.wrapping_add(1));
            h = fnv(h, &rsp);
            b.write_response(&rsp).unwrap();
            done += 1;
        }
        b.push_responses_and_check_notify();
        b.final_check_for_requests().unwrap();
        std::hint::spin_loop();
    }
    let mut line = String::new();
    c.stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("done {N} {h:016x}"));
}
