//! SIGTERM and SIGINT become a polite shutdown of the daemon.

use super::ShutdownHandle;

/// Starts a thread that waits for SIGTERM or SIGINT and asks the daemon to stop. A second
/// signal while stopping is ignored (closing channels takes bounded time).
pub fn install(handle: ShutdownHandle) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    // Register in this thread so a signal that arrives right after start-up is not missed.
    let (mut term, mut int) = {
        let _guard = rt.enter();
        (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        )
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(async {
                loop {
                    let name = tokio::select! {
                        _ = term.recv() => "SIGTERM",
                        _ = int.recv() => "SIGINT",
                    };
                    tracing::info!("{name} received: closing every channel and stopping");
                    handle.shutdown();
                }
            })
        })?;
    Ok(())
}
