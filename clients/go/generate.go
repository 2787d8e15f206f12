package idemd

// The gRPC stubs in gen/ are generated from proto/idemd/v1/idempotency.proto
// and never committed.
//go:generate bash scripts/generate.sh
