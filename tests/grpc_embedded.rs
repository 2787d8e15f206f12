//! The gRPC contract suite against a real server on the embedded store.

mod common;
mod grpc_suite;

use common::TestServer;

async fn start() -> TestServer {
    TestServer::embedded().await
}

grpc_suite!(start);
