//! `vrdma-xenstored --socket PATH`: the embedded XenStore server on a Unix socket (in progress).

fn main() -> anyhow::Result<()> {
    anyhow::bail!("vrdma-xenstored is not implemented yet")
}
