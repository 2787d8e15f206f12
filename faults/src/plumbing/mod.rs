//! What the scenarios act on and through, with no judgement of their own:
//! processes, namespaces, links, the Cassandra cluster. Nothing here knows
//! what a scenario checks; every module fails loudly (an `Err` naming the
//! command and what it said) when the world does not do as asked, so a
//! fault that was never injected cannot pass as survived.

pub mod cluster;
pub mod disk;
pub mod grpc;
pub mod namespace;
pub mod network;
pub mod server;
