//! The integration tests against a real Cassandra (or ScyllaDB) cluster,
//! as one test binary: `make cql-test` starts a local cluster
//! (`scripts/with-cassandra.sh`) and runs `cargo test --features cql-tests
//! --test cql`. The shared helpers are those of `tests/it`.

#[path = "../audit_conformance/mod.rs"]
#[macro_use]
mod audit_conformance;
#[path = "../common/mod.rs"]
mod common;
#[path = "../cql_support/mod.rs"]
mod cql_support;
#[path = "../grpc_suite/mod.rs"]
#[macro_use]
mod grpc_suite;
#[path = "../keys_suite/mod.rs"]
#[macro_use]
mod keys_suite;
#[path = "../proxy_suite/mod.rs"]
#[macro_use]
mod proxy_suite;
#[path = "../store_conformance/mod.rs"]
#[macro_use]
mod store_conformance;

mod copy_to_cql;
mod cql_cluster;
mod encryption_cql;
mod grpc_cql;
mod keys_cql;
mod mixed_fleet_cql;
mod pending_cql;
mod proxy_cql;
mod rollout_cql;
mod round_trips_cql;
mod store_cql;
