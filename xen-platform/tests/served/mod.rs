//! `vrdma-simhost serve` started as its own process for a test, killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_vrdma-simhost");

pub struct Served {
    pub dir: tempfile::TempDir,
    pub child: Child,
}

impl Served {
    /// Starts the host in a fresh directory and waits until it says it is serving.
    pub fn start() -> Served {
        Served::start_in(tempfile::tempdir().unwrap())
    }

    /// Starts the host in `dir` (e.g. one an earlier, killed host left its sockets in).
    pub fn start_in(dir: tempfile::TempDir) -> Served {
        let mut child = Command::new(BIN)
            .args(["serve", "--dir"])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("serving"), "serve printed {line:?}");
        Served { dir, child }
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
