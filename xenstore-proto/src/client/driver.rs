//! The connection task: one loop writes queued frames in order, one reads frames and hands
//! them to the [`Demux`]. When either ends, every waiter fails with the reason.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::demux::Demux;
use super::transport::{BoxRead, BoxWrite};
use crate::wire::{FrameDecoder, HEADER_LEN, PAYLOAD_MAX};

/// Starts the connection task on the current runtime; frames sent on the returned queue are
/// written in order. The task ends when every sender is dropped or the connection dies.
pub(crate) fn spawn(
    reader: BoxRead,
    writer: BoxWrite,
    demux: Arc<Demux>,
) -> mpsc::UnboundedSender<Vec<u8>> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let reason = tokio::select! {
            reason = read_loop(reader, &demux) => reason,
            reason = write_loop(writer, rx) => reason,
        };
        demux.fail_all(reason);
    });
    tx
}

async fn read_loop(mut reader: BoxRead, demux: &Demux) -> String {
    let mut decoder = FrameDecoder::new();
    let mut buf = vec![0u8; HEADER_LEN + PAYLOAD_MAX];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) => return "xenstored closed the connection".to_owned(),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return format!("read failed: {e}"),
        };
        decoder.push(&buf[..n]);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    if let Err(why) = demux.dispatch(frame) {
                        return format!("protocol violation: {why}");
                    }
                }
                Ok(None) => break,
                Err(e) => return format!("protocol violation: {e}"),
            }
        }
    }
}

async fn write_loop(mut writer: BoxWrite, mut queue: mpsc::UnboundedReceiver<Vec<u8>>) -> String {
    while let Some(frame) = queue.recv().await {
        // One message per write where the transport allows it (xenbus wants whole messages).
        if let Err(e) = writer.write_all(&frame).await {
            return format!("write failed: {e}");
        }
        if let Err(e) = writer.flush().await {
            return format!("write failed: {e}");
        }
    }
    "client closed the connection".to_owned()
}
