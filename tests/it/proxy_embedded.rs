//! The `idemd proxy` suite on the embedded store.

proxy_suite!(crate::common::start_embedded);
