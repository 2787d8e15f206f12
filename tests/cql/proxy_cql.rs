//! The `idemd proxy` suite on the CQL backend.

proxy_suite!(crate::cql_support::start_cql);
