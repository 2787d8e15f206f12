//! The `idemd keys` suite on the CQL backend.

keys_suite!(crate::cql_support::start_cql);
