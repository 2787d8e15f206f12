//! The gRPC contract suite against a real server on the embedded store.

use crate::common::TestServer;

async fn start() -> TestServer {
    TestServer::embedded().await
}

grpc_suite!(start);
