//! Random sequences of node operations, inside and outside transactions, run through the
//! blocking and the tokio client against the embedded server, and checked step by step
//! against a small model of xenstored's tree (dom0's view: no permission failures).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use xenstore_proto::client::{AsyncClient, AsyncTransaction, Client, NodeOps, RetryPolicy};
use xenstore_proto::server::{Config, Server};
use xenstore_proto::wire::{Perm, PermKind, Perms, XsErrno};

#[derive(Debug, Clone)]
enum Op {
    Write(String, Vec<u8>),
    Read(String),
    Mkdir(String),
    Rm(String),
    Directory(String),
    Exists(String),
    GetPerms(String),
    SetPerms(String, Perms),
}

#[derive(Debug, Clone)]
enum Step {
    Op(Op),
    /// Operations in one transaction, then commit (`true`) or abort.
    Tx(Vec<Op>, bool),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Done,
    Value(Vec<u8>),
    Children(BTreeSet<String>),
    Exists(bool),
    Perms(Perms),
    Failed(XsErrno),
}

fn outcome<T>(r: xenstore_proto::client::Result<T>, ok: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => ok(v),
        Err(e) => Outcome::Failed(
            e.errno()
                .unwrap_or_else(|| panic!("not a XenStore errno: {e}")),
        ),
    }
}

#[derive(Debug, Clone)]
struct Node {
    value: Vec<u8>,
    perms: Perms,
}

/// The tree as xenstored keeps it, for the nodes the tests touch.
#[derive(Debug, Clone)]
struct Model {
    nodes: BTreeMap<String, Node>,
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) => "/",
        Some(i) => &path[..i],
        None => unreachable!("absolute paths only"),
    }
}

impl Model {
    fn new(root_perms: Perms) -> Model {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            "/".to_owned(),
            Node {
                value: Vec::new(),
                perms: root_perms,
            },
        );
        Model { nodes }
    }

    /// Creates `path` and missing parents; new nodes copy their parent's permissions.
    fn create(&mut self, path: &str, value: &[u8]) {
        let mut missing = vec![path.to_owned()];
        let mut top = parent(path);
        while !self.nodes.contains_key(top) {
            missing.push(top.to_owned());
            top = parent(top);
        }
        let mut perms = self.nodes[top].perms.clone();
        for (i, p) in missing.iter().rev().enumerate() {
            let value = if i + 1 == missing.len() {
                value.to_vec()
            } else {
                Vec::new()
            };
            self.nodes.insert(
                p.clone(),
                Node {
                    value,
                    perms: perms.clone(),
                },
            );
            perms = self.nodes[p].perms.clone();
        }
    }

    fn children(&self, path: &str) -> BTreeSet<String> {
        let prefix = if path == "/" {
            "/".to_owned()
        } else {
            format!("{path}/")
        };
        self.nodes
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .map(str::to_owned)
            .collect()
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        let missing = Outcome::Failed(XsErrno::ENOENT);
        match op {
            Op::Write(p, v) => {
                match self.nodes.get_mut(p) {
                    Some(node) => node.value = v.clone(),
                    None => self.create(p, v),
                }
                Outcome::Done
            }
            Op::Read(p) => self
                .nodes
                .get(p)
                .map_or(missing, |n| Outcome::Value(n.value.clone())),
            Op::Mkdir(p) => {
                if !self.nodes.contains_key(p) {
                    self.create(p, b"");
                }
                Outcome::Done
            }
            Op::Rm(p) => {
                if self.nodes.contains_key(p) {
                    let below = format!("{p}/");
                    self.nodes.retain(|k, _| k != p && !k.starts_with(&below));
                    Outcome::Done
                } else if self.nodes.contains_key(parent(p)) {
                    Outcome::Done
                } else {
                    missing
                }
            }
            Op::Directory(p) => {
                if self.nodes.contains_key(p) {
                    Outcome::Children(self.children(p))
                } else {
                    missing
                }
            }
            Op::Exists(p) => Outcome::Exists(self.nodes.contains_key(p)),
            Op::GetPerms(p) => self
                .nodes
                .get(p)
                .map_or(missing, |n| Outcome::Perms(n.perms.clone())),
            Op::SetPerms(p, perms) => match self.nodes.get_mut(p) {
                Some(node) => {
                    node.perms = perms.clone();
                    Outcome::Done
                }
                None => missing,
            },
        }
    }
}

fn apply_blocking(ops: &dyn NodeOps, op: &Op) -> Outcome {
    match op {
        Op::Write(p, v) => outcome(ops.write(p, v), |()| Outcome::Done),
        Op::Read(p) => outcome(ops.read(p), Outcome::Value),
        Op::Mkdir(p) => outcome(ops.mkdir(p), |()| Outcome::Done),
        Op::Rm(p) => outcome(ops.rm(p), |()| Outcome::Done),
        Op::Directory(p) => outcome(ops.directory(p), |c| {
            Outcome::Children(c.into_iter().collect())
        }),
        Op::Exists(p) => outcome(ops.exists(p), Outcome::Exists),
        Op::GetPerms(p) => outcome(ops.get_perms(p), Outcome::Perms),
        Op::SetPerms(p, perms) => outcome(ops.set_perms(p, perms), |()| Outcome::Done),
    }
}

async fn apply_async(client: &AsyncClient, tx: Option<&AsyncTransaction>, op: &Op) -> Outcome {
    match (op, tx) {
        (Op::Write(p, v), None) => outcome(client.write(p, v).await, |()| Outcome::Done),
        (Op::Write(p, v), Some(tx)) => outcome(tx.write(p, v).await, |()| Outcome::Done),
        (Op::Read(p), None) => outcome(client.read(p).await, Outcome::Value),
        (Op::Read(p), Some(tx)) => outcome(tx.read(p).await, Outcome::Value),
        (Op::Mkdir(p), None) => outcome(client.mkdir(p).await, |()| Outcome::Done),
        (Op::Mkdir(p), Some(tx)) => outcome(tx.mkdir(p).await, |()| Outcome::Done),
        (Op::Rm(p), None) => outcome(client.rm(p).await, |()| Outcome::Done),
        (Op::Rm(p), Some(tx)) => outcome(tx.rm(p).await, |()| Outcome::Done),
        (Op::Directory(p), None) => outcome(client.directory(p).await, |c| {
            Outcome::Children(c.into_iter().collect())
        }),
        (Op::Directory(p), Some(tx)) => outcome(tx.directory(p).await, |c| {
            Outcome::Children(c.into_iter().collect())
        }),
        (Op::Exists(p), None) => outcome(client.exists(p).await, Outcome::Exists),
        (Op::Exists(p), Some(tx)) => outcome(tx.exists(p).await, Outcome::Exists),
        (Op::GetPerms(p), None) => outcome(client.get_perms(p).await, Outcome::Perms),
        (Op::GetPerms(p), Some(tx)) => outcome(tx.get_perms(p).await, Outcome::Perms),
        (Op::SetPerms(p, perms), None) => {
            outcome(client.set_perms(p, perms).await, |()| Outcome::Done)
        }
        (Op::SetPerms(p, perms), Some(tx)) => {
            outcome(tx.set_perms(p, perms).await, |()| Outcome::Done)
        }
    }
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!["a", "b", "c"]), 0..=3).prop_map(|names| {
        names
            .iter()
            .fold("/t".to_owned(), |p, n| format!("{p}/{n}"))
    })
}

fn perms() -> impl Strategy<Value = Perms> {
    let kind = prop::sample::select(vec![
        PermKind::None,
        PermKind::Read,
        PermKind::Write,
        PermKind::Both,
    ]);
    let domid = prop::sample::select(vec![0u32, 1, 5, 7]);
    prop::collection::vec((kind, domid), 1..=3)
        .prop_map(|entries| Perms(entries.into_iter().map(|(k, d)| Perm::new(k, d)).collect()))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (path(), prop::collection::vec(any::<u8>(), 0..8)).prop_map(|(p, v)| Op::Write(p, v)),
        2 => path().prop_map(Op::Read),
        1 => path().prop_map(Op::Mkdir),
        1 => path().prop_map(Op::Rm),
        2 => path().prop_map(Op::Directory),
        1 => path().prop_map(Op::Exists),
        1 => path().prop_map(Op::GetPerms),
        1 => (path(), perms()).prop_map(|(p, perms)| Op::SetPerms(p, perms)),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => op().prop_map(Step::Op),
        1 => (prop::collection::vec(op(), 0..8), any::<bool>()).prop_map(|(ops, c)| Step::Tx(ops, c)),
    ];
    prop::collection::vec(step, 1..40)
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Every node of the model reads back its value and lists its children.
fn check_tree_blocking(client: &Client, model: &Model) {
    for (p, node) in model.nodes.range("/t".to_owned()..) {
        if p != "/t" && !p.starts_with("/t/") {
            continue;
        }
        assert_eq!(client.read(p).unwrap(), node.value, "value of {p}");
        let listed: BTreeSet<String> = client.directory(p).unwrap().into_iter().collect();
        assert_eq!(listed, model.children(p), "children of {p}");
    }
}

fn run_blocking(steps: &[Step]) {
    let server = Server::new(Config::default());
    let client = Client::from_unix_stream(server.connect(0).unwrap())
        .unwrap()
        .with_retry_policy(RetryPolicy::attempts(1));
    let mut model = Model::new(client.get_perms("/").unwrap());
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Op(op) => {
                let want = model.apply(op);
                assert_eq!(apply_blocking(&client, op), want, "step {i}: {op:?}");
            }
            Step::Tx(ops, true) => {
                // Through the retrying helper: with no other writer it commits first time.
                let mut scratch = model.clone();
                client
                    .transaction(|tx| {
                        scratch = model.clone();
                        for op in ops {
                            let want = scratch.apply(op);
                            assert_eq!(apply_blocking(tx, op), want, "step {i} in tx: {op:?}");
                        }
                        Ok(())
                    })
                    .unwrap();
                model = scratch;
            }
            Step::Tx(ops, false) => {
                let tx = client.start_transaction().unwrap();
                let mut scratch = model.clone();
                for op in ops {
                    let want = scratch.apply(op);
                    assert_eq!(apply_blocking(&tx, op), want, "step {i} in tx: {op:?}");
                }
                tx.abort().unwrap();
            }
        }
    }
    check_tree_blocking(&client, &model);
}

fn run_async(steps: &[Step]) {
    let server = Server::new(Config::default());
    let stream = server.connect(0).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = AsyncClient::from_std_stream(stream).unwrap();
        let mut model = Model::new(client.get_perms("/").await.unwrap());
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Op(op) => {
                    let want = model.apply(op);
                    assert_eq!(
                        apply_async(&client, None, op).await,
                        want,
                        "step {i}: {op:?}"
                    );
                }
                Step::Tx(ops, commit) => {
                    let tx = client.start_transaction().await.unwrap();
                    let mut scratch = model.clone();
                    for op in ops {
                        let want = scratch.apply(op);
                        let got = apply_async(&client, Some(&tx), op).await;
                        assert_eq!(got, want, "step {i} in tx: {op:?}");
                    }
                    if *commit {
                        tx.commit().await.unwrap();
                        model = scratch;
                    } else {
                        tx.abort().await.unwrap();
                    }
                }
            }
        }
        for (p, node) in &model.nodes {
            if p == "/t" || p.starts_with("/t/") {
                assert_eq!(client.read(p).await.unwrap(), node.value, "value of {p}");
            }
        }
    });
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn blocking_client_matches_the_model(steps in steps()) {
        run_blocking(&steps);
    }

    #[test]
    fn async_client_matches_the_model(steps in steps()) {
        run_async(&steps);
    }
}

/// A listing too big for one reply comes back whole through `DIRECTORY_PART`.
#[test]
fn big_directory_is_listed_in_parts() {
    let server = Server::new(Config::default());
    let client = Client::from_unix_stream(server.connect(0).unwrap()).unwrap();
    let names: BTreeSet<String> = (0..400)
        .map(|i| format!("child-with-a-long-name-{i:04}"))
        .collect();
    client
        .transaction(|tx| {
            for n in &names {
                tx.write(&format!("/big/{n}"), "x")?;
            }
            Ok(())
        })
        .unwrap();
    let listed: BTreeSet<String> = client.directory("/big").unwrap().into_iter().collect();
    assert_eq!(listed, names);
}
