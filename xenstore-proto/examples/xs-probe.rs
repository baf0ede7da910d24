//! `xs-probe`: exercises this crate's client against any XenStore daemon — ours, or the real
//! `xenstored` of a Xen host (the Xen lab runs it in dom0 over the socket and over
//! `/dev/xen/xenbus`, and in PV domUs over `/dev/xen/xenbus`).
//!
//! ```sh
//! xs-probe [--xenbus | --socket PATH] selftest BASE [--children N] [--denied PATH]
//! xs-probe [--xenbus | --socket PATH] read PATH
//! ```
//! Without a transport flag the client uses `XENSTORED_PATH`, else `/run/xenstored/socket`.
//! `selftest` writes under BASE (a directory the caller may write) and, with `--denied`,
//! checks that reading PATH is refused with EACCES. `--children N` (default 300, enough to need
//! `DIRECTORY_PART`) sets the size of the large directory; xenstored counts a node's children
//! names against a domU's 2048-byte node-size quota, so a domU can only make small ones.

use std::process::ExitCode;
use std::time::Duration;

use xenstore_proto::client::{Client, Error};
use xenstore_proto::wire::XsErrno;

fn check(name: &str, ok: bool, detail: String, failures: &mut u32) {
    if ok {
        println!("XS-PROBE {name}: ok {detail}");
    } else {
        println!("XS-PROBE {name}: FAIL {detail}");
        *failures += 1;
    }
}

fn selftest(c: &Client, base: &str, children: u32, denied: Option<&str>) -> Result<u32, Error> {
    let mut failures = 0;
    let _ = c.rm(base);

    c.write(&format!("{base}/a"), "1")?;
    let v = c.read_string(&format!("{base}/a"))?;
    check("write-read", v == "1", format!("read {v:?}"), &mut failures);

    c.write(&format!("{base}/dir/x"), "")?;
    c.mkdir(&format!("{base}/dir/y"))?;
    let mut d = c.directory(&format!("{base}/dir"))?;
    d.sort();
    check(
        "directory",
        d == ["x", "y"],
        format!("{d:?}"),
        &mut failures,
    );

    let wpath = format!("{base}/w");
    c.mkdir(&wpath)?;
    let mut watch = c.watch(&wpath)?;
    let first = watch.next_timeout(Some(Duration::from_secs(30)))?;
    check(
        "watch-initial-fire",
        first.as_ref().map(|e| e.path.as_str()) == Some(wpath.as_str()),
        format!("{first:?}"),
        &mut failures,
    );
    let key = format!("{wpath}/k");
    c.write(&key, "v")?;
    let mut seen = false;
    while let Some(ev) = watch.next_timeout(Some(Duration::from_secs(30)))? {
        if ev.path == key {
            seen = true;
            break;
        }
    }
    check("watch-event", seen, key.clone(), &mut failures);
    drop(watch);

    let counter = format!("{base}/counter");
    c.write(&counter, "0")?;
    for _ in 0..10 {
        c.transaction(|tx| {
            let n: u32 = tx.read_string(&counter)?.parse().unwrap_or(0);
            tx.write(&counter, (n + 1).to_string())
        })?;
    }
    let n = c.read_string(&counter)?;
    check(
        "transactions",
        n == "10",
        format!("counter={n}"),
        &mut failures,
    );

    // More children than one 4096-byte reply holds: libxenstore-style DIRECTORY_PART.
    let big = format!("{base}/big");
    c.transaction(|tx| {
        for i in 0..children {
            tx.write(&format!("{big}/child-with-a-long-name-{i:04}"), "")?;
        }
        Ok(())
    })?;
    let listed = c.directory(&big)?;
    check(
        "large-directory",
        listed.len() == children as usize,
        format!("{} children", listed.len()),
        &mut failures,
    );

    let perms = c.get_perms(base)?;
    check(
        "get-perms",
        !perms.0.is_empty(),
        format!("{perms:?}"),
        &mut failures,
    );

    c.rm(&format!("{base}/a"))?;
    let gone = !c.exists(&format!("{base}/a"))?;
    check("rm", gone, String::new(), &mut failures);

    if let Some(path) = denied {
        let r = c.read(path);
        let refused = matches!(&r, Err(e) if e.errno() == Some(XsErrno::EACCES));
        check(
            "permission-denied",
            refused,
            format!("{path}: {r:?}"),
            &mut failures,
        );
    }
    c.rm(base)?;
    Ok(failures)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let client = match args.first().map(String::as_str) {
        Some("--xenbus") => {
            args.remove(0);
            Client::open_xenbus(xenstore_proto::client::XENBUS_DEVICE_PATH)
        }
        Some("--socket") if args.len() > 1 => {
            args.remove(0);
            Client::connect(args.remove(0))
        }
        _ => Client::from_env(),
    };
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            eprintln!("XS-PROBE: FAIL cannot connect: {e}");
            return ExitCode::from(2);
        }
    };
    let mut children = 300;
    if let Some(i) = args.iter().position(|a| a == "--children") {
        match args.get(i + 1).and_then(|n| n.parse().ok()) {
            Some(n) => children = n,
            None => {
                eprintln!("--children needs a number");
                return ExitCode::from(64);
            }
        }
        args.drain(i..i + 2);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["selftest", base] => selftest(&client, base, children, None),
        ["selftest", base, "--denied", path] => selftest(&client, base, children, Some(path)),
        ["read", path] => client.read_string(path).map(|v| {
            println!("{v}");
            0
        }),
        _ => {
            eprintln!("usage: xs-probe [--xenbus|--socket PATH] selftest BASE [--children N] [--denied PATH] | read PATH");
            return ExitCode::from(64);
        }
    };
    match result {
        Ok(0) => {
            println!("XS-PROBE: PASS");
            ExitCode::SUCCESS
        }
        Ok(n) => {
            println!("XS-PROBE: FAIL ({n} checks failed)");
            ExitCode::from(1)
        }
        Err(e) => {
            println!("XS-PROBE: FAIL {e}");
            ExitCode::from(1)
        }
    }
}
