//! What ClaimBatch and CompleteBatch add to the single RPCs: the item-count
//! limit, each item's endpoint checked against the batch's, and an item's
//! error carried as data.
//!
//! Why batches: a consumer that takes a poll of messages at once would
//! otherwise pay one round trip per message per step. A batch's items run
//! concurrently in one call, so the embedded store commits them with one
//! fsync (its writer group-commits whatever is queued) and CQL runs their
//! LWTs side by side. Each item is still answered by the same code as the
//! single RPC (`claim_item`, `complete_item` in [`super::idempotency`]): a
//! batch is never a second implementation of the state machine.
//!
//! Why one endpoint per batch: the token's endpoint allow-list is checked
//! once for the whole batch, and the RPC's span and metrics name one
//! endpoint. A consumer claims under one endpoint anyway.

use std::future::Future;

use tonic::Status;

use crate::engine::validate;
use crate::proto::v1 as pb;

use super::status;

/// Most items in one ClaimBatch or CompleteBatch. Enough to take a
/// consumer's whole poll (Kafka's `max.poll.records` defaults to 500), small
/// enough that one batch cannot hold the store's writer (whose group commit
/// takes up to 1,024 operations) or a CQL connection's streams for long.
pub const MAX_BATCH_ITEMS: usize = 500;

/// Refuses a batch without a valid endpoint (naming `endpoint`), and an
/// empty batch or one over [`MAX_BATCH_ITEMS`] (naming `field`).
pub fn check(endpoint: &str, field: &str, len: usize) -> Result<(), Status> {
    validate::endpoint(endpoint).map_err(status::engine_status)?;
    if len == 0 || len > MAX_BATCH_ITEMS {
        return Err(status::invalid_field(
            field,
            &format!("must hold 1 to {MAX_BATCH_ITEMS} items, got {len}"),
        ));
    }
    Ok(())
}

/// A batch item's request message: its endpoint is the batch's or empty.
pub trait BatchItem {
    /// The item's `endpoint` field.
    fn endpoint_mut(&mut self) -> &mut String;
}

impl BatchItem for pb::ClaimRequest {
    fn endpoint_mut(&mut self) -> &mut String {
        &mut self.endpoint
    }
}

impl BatchItem for pb::CompleteRequest {
    fn endpoint_mut(&mut self) -> &mut String {
        &mut self.endpoint
    }
}

/// The item with the batch's endpoint filled in; an item that names another
/// endpoint is refused (INVALID_ARGUMENT naming `field[index].endpoint`),
/// since the caller was authorized for the batch's endpoint only.
pub fn with_endpoint<T: BatchItem>(
    field: &str,
    index: usize,
    batch_endpoint: &str,
    mut item: T,
) -> Result<T, Status> {
    let endpoint = item.endpoint_mut();
    if endpoint.is_empty() {
        batch_endpoint.clone_into(endpoint);
    } else if endpoint != batch_endpoint {
        return Err(status::invalid_field(
            &format!("{field}[{index}].endpoint"),
            "must be empty or the batch's endpoint",
        ));
    }
    Ok(item)
}

/// An item's status as data: code, message, and the encoded
/// `google.rpc.Status` that a single RPC would send as its
/// `grpc-status-details-bin` trailer.
pub fn item_error(status: Status) -> pb::ItemError {
    pb::ItemError {
        code: status.code() as i32,
        message: status.message().to_owned(),
        status_details: status.details().to_vec(),
    }
}

/// Runs each item's future on its own task (the RPC's trace context
/// carried along) and returns their results in the items' order. An item
/// whose task panicked is that item's INTERNAL; the others are unaffected.
pub async fn run_items<R, F>(items: impl Iterator<Item = F>) -> Vec<Result<R, Status>>
where
    R: Send + 'static,
    F: Future<Output = Result<R, Status>> + Send + 'static,
{
    let context = opentelemetry::Context::current();
    let tasks: Vec<_> = items
        .map(|item| {
            tokio::spawn(opentelemetry::context::FutureExt::with_context(
                item,
                context.clone(),
            ))
        })
        .collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(
            task.await
                .unwrap_or_else(|error| Err(status::item_panicked(&error))),
        );
    }
    results
}
