//! `Client::from_env` / `AsyncClient::connect_env` follow `XENSTORED_PATH`. The variable is
//! set once, before any thread of this test binary exists, so it is its own binary.

use xenstore_proto::client::{socket_path_from_env, AsyncClient, Client, XENSTORED_PATH_ENV};
use xenstore_proto::server::{Config, Server};

#[test]
fn env_constructors_use_xenstored_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xenstored.sock");
    std::env::set_var(XENSTORED_PATH_ENV, &path);
    assert_eq!(socket_path_from_env(), path);

    let server = Server::new(Config::default());
    let _listener = server.listen(&path, 0).unwrap();
    let client = Client::from_env().unwrap();
    client.write("/from-env", "blocking").unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = AsyncClient::connect_env().await.unwrap();
        assert_eq!(client.read_string("/from-env").await.unwrap(), "blocking");
    });
}
